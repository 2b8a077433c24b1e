#!/bin/bash
# ab.sh — on the GPU machine: alternate `kiln bench` runs over environment
# settings (A/B of a switch in one process's lifetime each, same machine, same
# call) and print one line per run: decode tok/s, its floor and fraction, and
# prefill tok/s. Stops starting runs after LIMIT seconds (default 300).
# Usage: tools/device/ab.sh KILN ROUNDS "ENV..." "ENV..." -- BENCH ARGS...
#   e.g. tools/device/ab.sh /tmp/b/kiln 3 "" "KILN_MOE_DOWN_SLOTS=0" -- \
#        --synthetic bench/shapes/qwen3-30b-a3b.json --prompt 128 --gen 128
# ("" is the default; each ENV is a space-separated list of NAME=VALUE.)
set -u
kiln=$1 rounds=$2
shift 2
cfgs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cfgs+=("$1"); shift; done
[ $# -gt 0 ] && shift
limit=${LIMIT:-300}
t0=$(date +%s)
summary() {
    python3 -c 'import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        d = json.loads(line)
        print("decode %.2f floor %.2f frac %.3f prefill %.0f" % (d["decode_tok_s"], d["decode_floor_tok_s"],
              d["decode_fraction_of_floor"], d["prefill_tok_s"]))
    elif line:
        print(line)'
}
for ((r = 1; r <= rounds; r++)); do
    for c in "${cfgs[@]}"; do
        [ $(($(date +%s) - t0)) -gt "$limit" ] && exit 0
        echo "== round $r: ${c:-default}"
        env $c timeout 90 "$kiln" bench --backend cuda --json "$@" 2>&1 | summary
    done
done
