#!/usr/bin/env python3
# qgemv_trace_report.py — summarise a KILN_QGEMV_TRACE csv (a `cmake -DKILN_QGEMV_TRACE=ON` build,
# src/backend/cuda/cuda_qgemv_trace.cuh): the last decode step's bulk GEMVs, per kind, and a middle layer's
# sequence. Times in us; "release" = the programmatic wait returned. Usage: qgemv_trace_report.py qt.csv
import csv, sys, statistics as stt
from collections import defaultdict
rows = defaultdict(list); meta = {}
for r in csv.DictReader(open(sys.argv[1])):
    i = int(r["id"]); t = [int(r["t%d" % k]) for k in range(7)]
    rows[i].append((int(r["block"]), int(r["sm"]), t))
    meta[i] = (int(r["N"]), int(r["K"]), int(r["bits"]), int(r["epi"]), int(r["map"]), int(r["norm"]), int(r["blocks"]))
ks = []
for i, bl in rows.items():
    if any(x == 0 for b in bl for x in b[2]): continue
    ks.append(dict(id=i, meta=meta[i], t0=min(b[2][0] for b in bl), t2=min(b[2][2] for b in bl),
                   t6=max(b[2][6] for b in bl), bl=bl))
ks.sort(key=lambda k: k["t0"])
# last step: back from the last kernel until a gap > 300 us
step = [ks[-1]]
for k in reversed(ks[:-1]):
    if step[0]["t0"] - k["t6"] > 300_000: break
    step.insert(0, k)
print("kernels in the last step: %d, wall %.1f us" % (len(step), (step[-1]["t6"] - step[0]["t0"]) / 1e3))
def kind(m):
    N, K, bits, epi, mp, norm, blocks = m
    return "N%d K%d b%d epi%d map%d norm%d blk%d" % m
agg = defaultdict(lambda: defaultdict(list))
for j, k in enumerate(step):
    m = k["meta"]; N, K, bits = m[0], m[1], m[2]
    rowsN = N * (2 if m[3] else 1)
    byts = rowsN * K * bits / 8 + rowsN * (K // 64) * 4
    prev = step[j - 1] if j else None
    a = agg[kind(m)]
    us = lambda x: x / 1e3
    a["bytes_MB"].append(byts / 1e6)
    if prev:
        a["start_after_prev_end"].append(us(k["t0"] - prev["t6"]))
        a["release_after_prev_end"].append(us(k["t2"] - prev["t6"]))
        a["end_after_prev_end"].append(us(k["t6"] - prev["t6"]))
        a["GBs_prev_end_to_end"].append(byts / max(1, k["t6"] - prev["t6"]))
    a["span_t0_t6"].append(us(k["t6"] - k["t0"]))
    a["release_to_end"].append(us(k["t6"] - k["t2"]))
    a["GBs_release_to_end"].append(byts / max(1, k["t6"] - k["t2"]))
    for nm, (x, y) in {"blk_issue01": (0, 1), "blk_wait12": (1, 2), "blk_prologue23": (2, 3), "blk_firstchunk34": (3, 4),
                       "blk_stream45": (4, 5), "blk_tail56": (5, 6)}.items():
        a[nm + "_med"].append(us(stt.median(b[2][y] - b[2][x] for b in k["bl"])))
        a[nm + "_max"].append(us(max(b[2][y] - b[2][x] for b in k["bl"])))
    ends = sorted(b[2][6] - k["t2"] for b in k["bl"])
    a["blk_end_p10"].append(us(ends[len(ends) // 10])); a["blk_end_p50"].append(us(ends[len(ends) // 2]))
    a["blk_end_max"].append(us(ends[-1]))
    starts = sorted(b[2][0] - k["t0"] for b in k["bl"])
    a["blk_start_p50"].append(us(starts[len(starts) // 2])); a["blk_start_max"].append(us(starts[-1]))
    a["prologue_end_max_after_release"].append(us(max(b[2][3] for b in k["bl"]) - k["t2"]))
for kd, a in agg.items():
    print("\n== %s  (x%d)" % (kd, len(a["span_t0_t6"])))
    for nm, v in a.items():
        print("  %-34s mean %9.2f  med %9.2f  min %9.2f  max %9.2f" % (nm, stt.mean(v), stt.median(v), min(v), max(v)))
print("\nsequence (middle layer):")
mid = len(step) // 2
for k in step[mid - 6: mid + 6]:
    print("  id %4d %-40s t0 %+9.2f rel %+9.2f end %+9.2f" % (k["id"], kind(k["meta"]), (k["t0"] - step[0]["t0"]) / 1e3,
          (k["t2"] - step[0]["t0"]) / 1e3, (k["t6"] - step[0]["t0"]) / 1e3))
