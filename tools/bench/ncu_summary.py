#!/usr/bin/env python3
"""Summarize an `ncu --csv --metrics gpu__time_duration.sum` log: total GPU
time per kernel name, largest first. Usage: ncu_summary.py LOG.csv"""
import csv
import sys
from collections import defaultdict

rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, data = rows[0], rows[1:]
ik, iv, iu = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
tot, cnt = defaultdict(float), defaultdict(int)
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
for r in data:
    name = r[ik].split("(")[0][:60]
    tot[name] += float(r[iv].replace(",", "")) * scale.get(r[iu], 1.0)
    cnt[name] += 1
all_us = sum(tot.values())
print(f"{'kernel':60s} {'n':>5s} {'total us':>10s} {'mean us':>9s} {'share':>6s}")
for k in sorted(tot, key=tot.get, reverse=True):
    print(f"{k:60s} {cnt[k]:5d} {tot[k]:10.1f} {tot[k]/cnt[k]:9.2f} {tot[k]/all_us:6.1%}")
print(f"{'all':60s} {sum(cnt.values()):5d} {all_us:10.1f}")
