#!/bin/sh
# serve_smoke.sh — on the GPU machine: start `kiln serve` on the CUDA backend
# with the server fixture and check its answers against the HF oracle
# (tools/device/serve_check.py). Usage: tools/device/serve_smoke.sh [KILN_BIN]
bin=${1:-/tmp/b/kiln}
fix=tests/fixtures/server_chat
"$bin" serve "$fix" --backend cuda --port 18080 >/tmp/serve.log 2>&1 &
pid=$!
i=0
until curl -sf http://127.0.0.1:18080/health >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -gt 100 ] && { echo "serve_smoke: server did not start"; cat /tmp/serve.log; kill $pid; exit 1; }
    sleep 0.2
done
python3 tools/device/serve_check.py http://127.0.0.1:18080 "$fix"; rc=$?
kill $pid; wait $pid 2>/dev/null
tail -3 /tmp/serve.log
exit $rc
