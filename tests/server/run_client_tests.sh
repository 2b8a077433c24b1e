#!/bin/bash
# run_client_tests.sh — drive real `kiln serve` processes with the official
# `openai` and `@anthropic-ai/sdk` npm clients (tests/server/client_test.mjs).
#
# usage: run_client_tests.sh KILN_BIN REPO_ROOT NPM_DIR
# Installs the pinned clients into NPM_DIR (git-ignored, e.g. build/npm) when
# missing, starts three servers on free ports (--port 0; the port is read
# from the server's "serving ... on http://..." line):
#   A  tests/fixtures/llama (token ids only), API key, max batch 8
#   B  tests/fixtures/llama, --ctx 4096 --max-batch 1 --max-queue 1 (long
#      generations: 429 and disconnect paths)
#   C  tests/fixtures/server_chat (tokenizer + chat template) when present
#   W  tests/fixtures/whisper (transcription-only server), API key, a 600 kB
#      body limit (the 413 path with a real upload)
# runs the client tests, then stops every server with SIGTERM and requires a
# clean exit (graceful shutdown). Exit status: 0 only if everything passed.
# KILN_SERVE_ARGS: extra arguments for every server, e.g. "--backend cuda"
# (on the GPU machine: tools/device/client_tests.sh).
set -u
BIN=$1
ROOT=$2
NPM=$3
OPENAI_VERSION=7.59.0
ANTHROPIC_VERSION=1.16.0

if [ ! -f "$NPM/node_modules/openai/package.json" ] || [ ! -f "$NPM/node_modules/@anthropic-ai/sdk/package.json" ]; then
  mkdir -p "$NPM"
  npm install --prefix "$NPM" --no-audit --no-fund --silent "openai@$OPENAI_VERSION" \
    "@anthropic-ai/sdk@$ANTHROPIC_VERSION" >&2 || { echo "run_client_tests: npm install failed" >&2; exit 1; }
fi

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# start NAME MODEL ARGS... -> sets URL_NAME
start() {
  local name=$1 model=$2
  shift 2
  # shellcheck disable=SC2086 # KILN_SERVE_ARGS is a word list
  "$BIN" serve "$model" --port 0 "$@" ${KILN_SERVE_ARGS:-} 2>"$WORK/$name.log" &
  local pid=$!
  PIDS+=("$pid")
  echo "$pid" >"$WORK/$name.pid"
  local port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's|.* on http://127\.0\.0\.1:\([0-9][0-9]*\) .*|\1|p' "$WORK/$name.log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "run_client_tests: server $name did not start:" >&2
    cat "$WORK/$name.log" >&2
    exit 1
  fi
  eval "URL_$name=http://127.0.0.1:$port"
}

start A "$ROOT/tests/fixtures/llama" --api-key test-key --max-batch 8
start B "$ROOT/tests/fixtures/llama" --ctx 4096 --max-batch 1 --max-queue 1
URL_C=""
if [ -d "$ROOT/tests/fixtures/server_chat" ]; then
  start C "$ROOT/tests/fixtures/server_chat" --max-batch 8
fi

start W "$ROOT/tests/fixtures/whisper" --api-key audio-key --max-body 600000

KILN_URL_A=$URL_A KILN_URL_B=$URL_B KILN_URL_C=$URL_C KILN_URL_W=$URL_W KILN_BIN="$BIN" KILN_SERVE_ARGS="${KILN_SERVE_ARGS:-}" \
  KILN_FIXTURES="$ROOT/tests/fixtures" NODE_PATH="$NPM/node_modules" \
  node "$ROOT/tests/server/client_test.mjs" "$NPM/node_modules"
status=$?

# graceful shutdown: SIGTERM, clean exit within 10 s
for name in A B C W; do
  [ -f "$WORK/$name.pid" ] || continue
  pid=$(cat "$WORK/$name.pid")
  kill -TERM "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL server $name did not exit within 10 s of SIGTERM" >&2
    status=1
  else
    wait "$pid"
    rc=$?
    if [ "$rc" != 0 ]; then
      echo "FAIL server $name exited with $rc after SIGTERM" >&2
      tail -5 "$WORK/$name.log" >&2
      status=1
    fi
  fi
done
exit $status
