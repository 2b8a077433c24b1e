#!/bin/sh
# test_cli_whisper.sh — `kiln mel`, `kiln logits --mel` and `kiln transcribe`
# through the real binary: output shapes, oracle tokens, one-line errors.
# usage: test_cli_whisper.sh KILN_BIN FIXTURES_DIR
set -u
KILN=$1
FIX=$2
W=$FIX/whisper
JFK=$FIX/audio/jfk.wav
. "$(dirname "$0")/cli_lib.sh"
[ -f "$W/reference.json" ] || { echo "FAIL: missing fixture $W (tools/fixtures/gen_whisper.py)" >&2; exit 1; }

# mel: float32 [n_mels, 3000]
for n in 80 128; do
    "$KILN" mel "$JFK" --n-mels $n --out "$TMP/m$n.npy" || fail "mel $n"
    size=$(wc -c <"$TMP/m$n.npy")
    [ "$size" -eq $((128 + n * 3000 * 4)) ] || fail "mel $n file size $size"
    head -c 128 "$TMP/m$n.npy" | grep -q "'shape': ($n, 3000)" || fail "mel $n npy header"
done
: >"$TMP/empty.wav"
expect_error "empty" "$KILN" mel "$TMP/empty.wav" --out "$TMP/x.npy"
head -c 3000 /dev/urandom >"$TMP/junk.wav" 2>/dev/null || dd if=/dev/zero of="$TMP/junk.wav" bs=1 count=3000 2>/dev/null
expect_error "not a readable audio file" "$KILN" mel "$TMP/junk.wav" --out "$TMP/x.npy"
expect_error "cannot open" "$KILN" mel "$TMP/nope.wav" --out "$TMP/x.npy"
expect_error "80 or 128" "$KILN" mel "$JFK" --n-mels 64 --out "$TMP/x.npy"
expect_error "missing --out" "$KILN" mel "$JFK"
expect_error "unknown backend" "$KILN" mel "$JFK" --backend tpu --out "$TMP/x.npy"

# logits --mel: float32 [n_ids, vocab]
ids=$(tr -d '\n' <"$W/reference.json" | sed -n 's/.*"teacher_ids": *\[\([^]]*\)\].*/\1/p' | tr -d ' ')
vocab=$(tr -d '\n' <"$W/config.json" | sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p')
n_ids=$(echo "$ids" | tr ',' '\n' | wc -l)
"$KILN" logits "$W" --ids "$ids" --mel "$TMP/m80.npy" --out "$TMP/l.npy" || fail "logits --mel"
head -c 128 "$TMP/l.npy" | grep -q "'shape': ($n_ids, $vocab)" || fail "logits --mel header: $(head -c 100 "$TMP/l.npy")"
expect_error "give --mel" "$KILN" logits "$W" --ids 1,2 --out "$TMP/x.npy"
expect_error "expected a float32 mel \[80, 3000\]" "$KILN" logits "$W" --ids 1,2 --mel "$TMP/m128.npy" --out "$TMP/x.npy"
expect_error "out of range" "$KILN" logits "$W" --ids 1,99999 --mel "$TMP/m80.npy" --out "$TMP/x.npy"

# transcribe on kiln's own mel: transformers' greedy tokens (no timestamps, en)
want=$(tr -d '\n' <"$W/reference.json" | sed -n 's/.*"name": *"greedy_en_notimestamps"[^}]*"tokens": *\[\([^]]*\)\].*/\1/p' | tr -d ' ' | tr ',' ' ')
eot=$(tr -d '\n' <"$W/reference.json" | sed -n 's/.*"<|endoftext|>": *\([0-9]*\).*/\1/p')
want=$(echo "$want" | sed "s/ *$eot\$//")
got=$("$KILN" transcribe "$JFK" --model "$W" --format tokens --no-timestamps --language en --no-fallback \
      --max-new-tokens 24 2>"$TMP/err" | cut -d' ' -f3-) || fail "transcribe: $(cat "$TMP/err")"
[ -n "$want" ] && [ "$got" = "$want" ] || fail "transcribe tokens: got '$got' want '$want'"
grep -q "window" "$TMP/err" || fail "transcribe: stats should go to stderr"

# text formats through the fixture's tokenizer
"$KILN" transcribe "$JFK" --model "$W" --format srt --language en --no-fallback --max-new-tokens 24 \
    >"$TMP/o.srt" 2>"$TMP/err" || fail "srt: $(cat "$TMP/err")"
head -1 "$TMP/o.srt" | grep -qx "1" || fail "srt: first line should be 1: $(head -3 "$TMP/o.srt")"
sed -n 2p "$TMP/o.srt" | grep -Eq '^[0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3} --> [0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3}$' \
    || fail "srt: time line: $(sed -n 2p "$TMP/o.srt")"
"$KILN" transcribe "$JFK" --model "$W" --format vtt --language en --no-fallback --max-new-tokens 24 \
    2>/dev/null | head -1 | grep -qx "WEBVTT" || fail "vtt header"
"$KILN" transcribe "$JFK" --model "$W" --format verbose_json --language en --no-fallback --max-new-tokens 24 \
    --prompt "And so my fellow Americans" 2>"$TMP/err" | grep -q '"segments":\[{"id":0' || fail "verbose_json with --prompt: $(cat "$TMP/err")"
"$KILN" transcribe "$JFK" --model "$W" --format verbose_json --language en --no-fallback --max-new-tokens 24 \
    --word-timestamps 2>"$TMP/err" | grep -q '"words":\[{"word":' || fail "verbose_json --word-timestamps: $(cat "$TMP/err")"
expect_error "needs a text format" "$KILN" transcribe "$JFK" --model "$W" --format tokens --word-timestamps
expect_error "missing --model" "$KILN" transcribe "$JFK"
expect_error "not a whisper model" "$KILN" transcribe "$JFK" --model "$FIX/llama" --format tokens
expect_error "transcribe or translate" "$KILN" transcribe "$JFK" --model "$W" --task summarize
expect_error "not in this model" "$KILN" transcribe "$JFK" --model "$W" --language xx --format tokens
expect_error "not a readable audio file" "$KILN" transcribe "$TMP/junk.wav" --model "$W" --format tokens
expect_error "use text, json" "$KILN" transcribe "$JFK" --model "$W" --format docx
# checkpoints that do not match their config, or are truncated
mkdir -p "$TMP/bad"
cp "$W"/*.json "$TMP/bad/"
sed 's/"d_model": 64/"d_model": 32/' "$W/config.json" >"$TMP/bad/config.json"
cp "$W/model.safetensors" "$TMP/bad/"
expect_error "expected \[32, 80, 3\]" "$KILN" transcribe "$JFK" --model "$TMP/bad" --format tokens
cp "$W/config.json" "$TMP/bad/config.json"
head -c 100000 "$W/model.safetensors" >"$TMP/bad/model.safetensors"
expect_error "safetensors" "$KILN" transcribe "$JFK" --model "$TMP/bad" --format tokens

if [ "$fails" -ne 0 ]; then echo "test_cli_whisper: $fails failure(s)" >&2; exit 1; fi
echo "test_cli_whisper: all checks passed"
