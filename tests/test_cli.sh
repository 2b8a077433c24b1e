#!/bin/sh
# test_cli.sh — the CLI contract (DESIGN.md), driven through the real binary:
# output formats, exit codes, and one-line errors for bad input.
# usage: test_cli.sh KILN_BIN FIXTURES_DIR
set -u
KILN=$1
FIX=$2
. "$(dirname "$0")/cli_lib.sh"

# greedy ids from a fixture's reference.json, space-separated
ref_list() { tr -d '\n' <"$1/reference.json" | sed -n "s/.*\"$2\": *\[\([^]]*\)\].*/\1/p" | tr -d ' ' | tr ',' ' '; }

for m in llama qwen3 phi3; do
    prompt=$(ref_list "$FIX/$m" prompt | tr ' ' ',')
    want=$(ref_list "$FIX/$m" greedy)
    got=$("$KILN" run "$FIX/$m" --ids "$prompt" -n 24 2>"$TMP/err") || fail "run $m: $(cat "$TMP/err")"
    [ "$got" = "$want" ] || fail "run $m --ids: got '$got' want '$want'"
    grep -q "tok/s" "$TMP/err" || fail "run $m: stats should go to stderr"
done

# KILN_CPU_PROFILE=1: the same ids, and a per-op table on stderr with the decode's matmul (fused with its RMSNorm)
# and attention rows
prompt=$(ref_list "$FIX/llama" prompt | tr ' ' ',')
got=$(KILN_CPU_PROFILE=1 "$KILN" run "$FIX/llama" --ids "$prompt" -n 24 2>"$TMP/err") || fail "profiled run: $(cat "$TMP/err")"
[ "$got" = "$(ref_list "$FIX/llama" greedy)" ] || fail "profiled run: got '$got'"
grep -q "^op (KILN_CPU_PROFILE" "$TMP/err" && grep -q "^fused_norm M=1 N=" "$TMP/err" && grep -q "^attention T=1 " "$TMP/err" ||
    fail "KILN_CPU_PROFILE table: $(cat "$TMP/err")"

# logits: float32 [n_ids, vocab] .npy
"$KILN" logits "$FIX/llama" --ids 5,6,7 --out "$TMP/l.npy" || fail "logits"
size=$(wc -c <"$TMP/l.npy")
[ "$size" -eq $((128 + 3 * 512 * 4)) ] || fail "logits file size $size"
head -c 128 "$TMP/l.npy" | grep -q "'shape': (3, 512)" || fail "npy header shape"

# seeded sampling is reproducible
a=$("$KILN" run "$FIX/llama" --ids 5,6,7 -n 16 --temp 0.9 --top-p 0.95 --top-k 40 --seed 7 --ignore-eos 2>/dev/null)
b=$("$KILN" run "$FIX/llama" --ids 5,6,7 -n 16 --temp 0.9 --top-p 0.95 --top-k 40 --seed 7 --ignore-eos 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "seeded sampling not reproducible: '$a' vs '$b'"
[ "$(echo "$a" | wc -w)" -eq 16 ] || fail "--ignore-eos -n 16 should give 16 ids: '$a'"

# errors: one clear line, non-zero exit
expect_error "does not exist" "$KILN" run "$TMP/nope" --ids 1
expect_error "non-negative integers" "$KILN" run "$FIX/llama" --ids 1,x
expect_error "outside the vocabulary" "$KILN" run "$FIX/llama" --ids 1,99999
expect_error "outside the vocabulary" "$KILN" logits "$FIX/llama" --ids 600 --out "$TMP/x.npy"
expect_error "missing --out" "$KILN" logits "$FIX/llama" --ids 1
expect_error "unknown command" "$KILN" frobnicate
mkdir -p "$TMP/bert"
echo '{"model_type": "bert", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1}' >"$TMP/bert/config.json"
expect_error "supported: llama, mistral, qwen2, qwen3, phi3" "$KILN" run "$TMP/bert" --ids 1
# a checkpoint whose tensors do not match its config
mkdir -p "$TMP/bad"
sed 's/"hidden_size": 64/"hidden_size": 32/' "$FIX/llama/config.json" >"$TMP/bad/config.json"
cp "$FIX/llama/model.safetensors" "$TMP/bad/"
expect_error "expected" "$KILN" run "$TMP/bad" --ids 1
# a truncated checkpoint
cp "$FIX/llama/config.json" "$TMP/bad/config.json"
head -c 5000 "$FIX/llama/model.safetensors" >"$TMP/bad/model.safetensors"
expect_error "safetensors" "$KILN" run "$TMP/bad" --ids 1
# a checkpoint missing a tensor is reported by name (index pointing at a shard lacking it)
"$KILN" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no arguments should exit 2"

# text prompts: -p through the tokenizer, --chat through the chat template; the server
# fixture's tiny model answers as transformers generated (reference.json)
SC="$FIX/server_chat"
got=$("$KILN" run "$SC" --chat -p "What is the capital of France?" -n 16 2>"$TMP/err") || fail "run --chat: $(cat "$TMP/err")"
[ "$got" = "The capital of France is Paris." ] || fail "run --chat: got '$got'"
got=$(printf 'What is the capital of France?\n' | "$KILN" run "$SC" --chat -n 16 2>"$TMP/err") || fail "run --chat (stdin): $(cat "$TMP/err")"
[ "$got" = "The capital of France is Paris." ] || fail "run --chat on stdin: got '$got'"
want=$(tr -d '\n' <"$SC/reference.json" | sed -n 's/.*"name": *"once".*"greedy_text_skip_special": *"\([^"]*\)".*"name": *"fox".*/\1/p')
prompt=$(tr -d '\n' <"$SC/reference.json" | sed -n 's/.*"name": *"once".*"prompt_text": *"\([^"]*\)".*"name": *"fox".*/\1/p')
got=$("$KILN" run "$SC" -p "$prompt" -n 24 2>"$TMP/err") || fail "run -p: $(cat "$TMP/err")"
[ -n "$want" ] && [ "$got" = "$want" ] || fail "run -p: got '$got' want '$want'"
expect_error "tokenizer" "$KILN" run "$FIX/llama" -p "hello"
expect_error "not both" "$KILN" run "$SC" -p "hi" --ids 1,2

if [ "$fails" -ne 0 ]; then echo "test_cli: $fails failure(s)" >&2; exit 1; fi
echo "test_cli: all checks passed"
