#!/usr/bin/env python3
"""gen_gguf.py — a synthetic llama-architecture GGUF file at a kiln bench shape,
so llama.cpp's llama-bench can run as a same-machine peer of
`kiln bench --synthetic` without downloading a model.

    python3 tools/bench/gen_gguf.py bench/shapes/llama-0.44b.json {bf16|q8_0|q4_0} OUT.gguf

Written from the GGUF v3 format description (header, typed metadata
key/values, tensor infos, aligned data); pure Python + struct. Weights are
random and small (|w| <= ~0.02, no NaN/Inf): a pool of random blocks is
generated once and repeated at shifting offsets, which is enough for a speed
benchmark (the numbers do not depend on the values). The vocabulary is a
dummy SentencePiece-style one of the shape's vocab_size (control tokens,
the 256 byte tokens, then placeholders). Every 2-D weight, including the
embedding and the output head, is stored in the chosen type (as kiln's
`bench --bits` quantizes all of them); norms are F32.
"""
import json
import random
import struct
import sys

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32

# metadata value types
T_UINT32, T_FLOAT32, T_STRING, T_ARRAY, T_INT32 = 4, 6, 8, 9, 5
# ggml tensor types and their block layout (elements per block, bytes per block)
GGML = {"f32": (0, 1, 4), "bf16": (30, 1, 2), "q8_0": (8, 32, 34), "q4_0": (2, 32, 18)}
FILE_TYPE = {"bf16": 32, "q8_0": 7, "q4_0": 2}  # llama_ftype: MOSTLY_BF16, MOSTLY_Q8_0, MOSTLY_Q4_0


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        out += struct.pack("<I", value)
    elif vtype == T_INT32:
        out += struct.pack("<i", value)
    elif vtype == T_FLOAT32:
        out += struct.pack("<f", value)
    elif vtype == T_STRING:
        out += gguf_str(value)
    else:
        raise ValueError(vtype)
    return out


def kv_array(key, etype, values):
    out = gguf_str(key) + struct.pack("<IIQ", T_ARRAY, etype, len(values))
    if etype == T_STRING:
        out += b"".join(gguf_str(v) for v in values)
    elif etype == T_FLOAT32:
        out += struct.pack("<%df" % len(values), *values)
    elif etype == T_INT32:
        out += struct.pack("<%di" % len(values), *values)
    return out


def bf16_bits(x):
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even


def make_pool(kind, rng, n_bytes):
    """n_bytes (about) of valid random blocks of the given type."""
    out = bytearray()
    if kind == "bf16":
        vals = [bf16_bits(rng.uniform(-0.02, 0.02)) for _ in range(n_bytes // 2)]
        out += struct.pack("<%dH" % len(vals), *vals)
    elif kind == "f32":
        vals = [rng.uniform(0.9, 1.1) for _ in range(n_bytes // 4)]
        out += struct.pack("<%df" % len(vals), *vals)
    elif kind == "q8_0":
        for _ in range(n_bytes // 34):
            out += struct.pack("<e", rng.uniform(0.0001, 0.0002))
            out += bytes(rng.randrange(256) for _ in range(32))
    elif kind == "q4_0":
        for _ in range(n_bytes // 18):
            out += struct.pack("<e", rng.uniform(0.002, 0.003))
            out += bytes(rng.randrange(256) for _ in range(16))
    return bytes(out)


def main():
    if len(sys.argv) != 4 or sys.argv[2] not in FILE_TYPE:
        sys.exit("usage: gen_gguf.py CONFIG.json bf16|q8_0|q4_0 OUT.gguf")
    cfg = json.load(open(sys.argv[1]))
    wtype, out_path = sys.argv[2], sys.argv[3]
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    L, V = cfg["num_hidden_layers"], cfg["vocab_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim", H // nh)
    if cfg.get("model_type") != "llama":
        sys.exit("gen_gguf.py writes the llama architecture only")

    # tensors: (name, dims with ne0 = input/innermost first, type)
    tensors = [("token_embd.weight", (H, V), wtype)]
    for l in range(L):
        p = "blk.%d." % l
        tensors += [
            (p + "attn_norm.weight", (H,), "f32"),
            (p + "attn_q.weight", (H, nh * hd), wtype),
            (p + "attn_k.weight", (H, nkv * hd), wtype),
            (p + "attn_v.weight", (H, nkv * hd), wtype),
            (p + "attn_output.weight", (nh * hd, H), wtype),
            (p + "ffn_norm.weight", (H,), "f32"),
            (p + "ffn_gate.weight", (H, I), wtype),
            (p + "ffn_up.weight", (H, I), wtype),
            (p + "ffn_down.weight", (I, H), wtype),
        ]
    tensors += [("output_norm.weight", (H,), "f32")]
    if not cfg.get("tie_word_embeddings", False):
        tensors += [("output.weight", (H, V), wtype)]

    def nbytes(dims, t):
        _, per, size = GGML[t]
        n = 1
        for d in dims:
            n *= d
        assert dims[0] % per == 0, "row length must be a multiple of the block size"
        return n // per * size

    # vocabulary: <unk>, <s>, </s>, 256 byte tokens, placeholders
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    tokens += ["t%d" % i for i in range(V - len(tokens))]
    ttypes = [2, 3, 3] + [6] * 256 + [1] * (V - 259)
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(V - 259)]

    meta = [
        kv("general.architecture", T_STRING, "llama"),
        kv("general.name", T_STRING, "kiln synthetic " + sys.argv[1].split("/")[-1]),
        kv("general.file_type", T_UINT32, FILE_TYPE[wtype]),
        kv("general.alignment", T_UINT32, ALIGN),
        kv("llama.context_length", T_UINT32, cfg.get("max_position_embeddings", 4096)),
        kv("llama.embedding_length", T_UINT32, H),
        kv("llama.block_count", T_UINT32, L),
        kv("llama.feed_forward_length", T_UINT32, I),
        kv("llama.rope.dimension_count", T_UINT32, hd),
        kv("llama.attention.head_count", T_UINT32, nh),
        kv("llama.attention.head_count_kv", T_UINT32, nkv),
        kv("llama.attention.key_length", T_UINT32, hd),
        kv("llama.attention.value_length", T_UINT32, hd),
        kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, cfg.get("rms_norm_eps", 1e-5)),
        kv("llama.rope.freq_base", T_FLOAT32, cfg.get("rope_theta", 10000.0)),
        kv("llama.vocab_size", T_UINT32, V),
        kv("tokenizer.ggml.model", T_STRING, "llama"),
        kv_array("tokenizer.ggml.tokens", T_STRING, tokens),
        kv_array("tokenizer.ggml.scores", T_FLOAT32, scores),
        kv_array("tokenizer.ggml.token_type", T_INT32, ttypes),
        kv("tokenizer.ggml.unknown_token_id", T_UINT32, 0),
        kv("tokenizer.ggml.bos_token_id", T_UINT32, 1),
        kv("tokenizer.ggml.eos_token_id", T_UINT32, 2),
    ]

    infos, offset = [], 0
    for name, dims, t in tensors:
        offset = (offset + ALIGN - 1) // ALIGN * ALIGN
        infos.append(gguf_str(name) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims) +
                     struct.pack("<IQ", GGML[t][0], offset))
        offset += nbytes(dims, t)

    rng = random.Random(1234)
    pools = {t: make_pool(t, rng, 1 << 20 if t == "f32" else (1 << 21) // GGML[t][2] * GGML[t][2])
             for t in {wtype, "f32"}}
    with open(out_path, "wb") as f:
        f.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        for i in infos:
            f.write(i)
        pos = f.tell()
        f.write(b"\0" * ((pos + ALIGN - 1) // ALIGN * ALIGN - pos))
        data0, written = f.tell(), 0
        for k, (name, dims, t) in enumerate(tensors):
            pad = (written + ALIGN - 1) // ALIGN * ALIGN - written
            f.write(b"\0" * pad)
            written += pad
            need, pool = nbytes(dims, t), pools[t]
            blk = GGML[t][2] * (4 if t == "f32" else 1)
            shift = (k * 7 % 64) * blk % len(pool)  # vary tensors: start at a different block
            rot = pool[shift:] + pool[:shift]
            while need > 0:
                n = min(need, len(rot))
                f.write(rot[:n])
                need -= n
                written += n
        assert f.tell() - data0 == written
    print("%s: %d tensors, %.3f GB of tensor data (%s)" % (out_path, len(tensors), written / 1e9, wtype))


if __name__ == "__main__":
    main()
