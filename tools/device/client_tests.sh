#!/bin/sh
# client_tests.sh — on the GPU machine: the server issue's npm-client suite
# (tests/server/run_client_tests.sh: the official openai and
# @anthropic-ai/sdk clients under Node) against `kiln serve --backend cuda`.
# That machine has neither Node nor the network: put a node binary on PATH
# and the installed clients in NPM_DIR (both can be carried from the dev
# machine, where `make test` installed them in build/npm-clients).
# Usage: tools/device/client_tests.sh [KILN_BIN] [NPM_DIR]
bin=${1:-/tmp/b/kiln}
npm_dir=${2:-/tmp/b/npm-clients}
command -v node >/dev/null || { echo "client_tests: node is not on PATH" >&2; exit 1; }
[ -f "$npm_dir/node_modules/openai/package.json" ] || { echo "client_tests: no clients in $npm_dir" >&2; exit 1; }
KILN_SERVE_ARGS="--backend cuda" exec tests/server/run_client_tests.sh "$bin" "$(pwd)" "$npm_dir"
