#!/usr/bin/env python3
"""timeline_report.py — summarise a kernel timeline written by kernel_timeline.c.

For the kernels launched from CUDA graphs (the decode steps; all kernels when
there are none) it prints, per kernel name:
  calls/step   launches per step
  mean us      mean duration (start to end, overlap included)
  exposed us   time per step during which this kernel was the only one left
               running to the right of every earlier kernel's end: the sum
               over names is the busy wall time, so this is what the kernel
               costs the step
  overlap us   mean time it started before the previous kernels had ended
and the step's wall, busy and idle time. --show N prints N consecutive
kernels of a middle step with their start offsets, to see the overlap itself.

  python3 tools/device/timeline_report.py tl.csv [--step-kernel k_embed] [--show 14]
"""
import argparse
import csv
import shutil
import subprocess
import sys
from collections import defaultdict


def demangle(names):
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short(name):
    """k_flash_tc<(int)128, (bool)0, ...>(args) -> k_flash_tc<128, 0, ...>"""
    name = name.removeprefix("void ")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # drop the parameter list after the template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    for t in ("(int)", "(bool)", "(long)", "(unsigned int)"):
        name = name.replace(t, "")
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--step-kernel", default="k_embed", help="a kernel launched once per step (counts the steps)")
    ap.add_argument("--show", type=int, default=0, help="print this many kernels of a middle step")
    args = ap.parse_args()

    rows = list(csv.DictReader(open(args.csv)))
    if not rows:
        sys.exit("no kernels in " + args.csv)
    names = demangle(sorted({r["name"] for r in rows}))
    ks = [(int(r["start_ns"]), int(r["end_ns"]), short(names[r["name"]]), int(r["graph"]), r) for r in rows]
    graphed = [k for k in ks if k[3] != 0]
    sel = sorted(graphed or ks, key=lambda k: (k[0], k[1]))  # by time only: the row dicts do not compare
    steps = sum(1 for k in sel if k[2].startswith(args.step_kernel)) or 1

    stats = defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # calls, duration, exposed, overlap (ns)
    frontier = sel[0][0]
    for s, e, n, _, _ in sel:
        st = stats[n]
        st[0] += 1
        st[1] += e - s
        st[2] += max(0, e - max(s, frontier))
        st[3] += max(0, frontier - s)
        frontier = max(frontier, e)
    wall = sel[-1][1] - sel[0][0]
    busy = sum(v[2] for v in stats.values())
    print(f"{len(sel)} kernels ({'graph replay' if graphed else 'no graphs'}), {steps} steps "
          f"(counted by {args.step_kernel})")
    print(f"per step: wall {wall / steps / 1e3:.1f} us, busy {busy / steps / 1e3:.1f} us, "
          f"idle {(wall - busy) / steps / 1e3:.1f} us")
    print(f"{'kernel':60s} {'calls/step':>10s} {'mean us':>9s} {'exposed us/step':>16s} {'overlap us':>11s}")
    for n, (c, d, x, o) in sorted(stats.items(), key=lambda kv: -kv[1][2]):
        print(f"{n[:60]:60s} {c / steps:10.2f} {d / c / 1e3:9.2f} {x / steps / 1e3:16.1f} {o / c / 1e3:11.2f}")

    if args.show:
        starts = [i for i, k in enumerate(sel) if k[2].startswith(args.step_kernel)]
        i0 = starts[len(starts) // 2] if starts else len(sel) // 2
        t0 = sel[i0][0]
        print(f"\n{args.show} kernels from a middle step (times in us from its first kernel's start):")
        print(f"{'start':>9s} {'end':>9s} {'dur':>7s}  {'grid':>12s} {'blk':>4s} {'regs':>4s}  kernel")
        for s, e, n, _, r in sel[i0:i0 + args.show]:
            grid = f"{r['grid_x']}x{r['grid_y']}x{r['grid_z']}"
            print(f"{(s - t0) / 1e3:9.2f} {(e - t0) / 1e3:9.2f} {(e - s) / 1e3:7.2f}  {grid:>12s} "
                  f"{r['block']:>4s} {r['regs']:>4s}  {n}")


if __name__ == "__main__":
    main()
