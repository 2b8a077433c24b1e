#!/usr/bin/env python3
"""Peer decode/prefill numbers from HF transformers on the GPU, for the same
synthetic shapes `kiln bench --synthetic` uses (random bf16 weights).

Usage: python3 tools/bench/peer_hf.py bench/shapes/llama3-8b.json [--prompt 128] [--gen 256]
           [--batch 1,64] [--compile] [--prefill 2048]

Reports, per batch: HF eager decode tok/s (model.generate-free loop over a
DynamicCache, greedy), and with --compile a torch.compile(mode="reduce-overhead")
one-token step over a StaticCache called with cudagraph_mark_step_begin()
before each step; --prefill N: eager SDPA prefill tok/s of one N-token prompt.
Prints one JSON object per measurement.
"""
import argparse
import json
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache


def sync():
    torch.cuda.synchronize()


def build(shape_path):
    cfg_dict = json.load(open(shape_path))
    model_type = cfg_dict.pop("model_type")
    cfg_dict.pop("architectures", None)
    cfg_dict.pop("torch_dtype", None)
    cfg = AutoConfig.for_model(model_type, **cfg_dict)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    return model, cfg


@torch.no_grad()
def eager_decode(model, cfg, batch, prompt, gen):
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda")
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    tok = out.logits[:, -1:].argmax(-1)
    # warm-up a few steps, then time
    for _ in range(3):
        out = model(input_ids=tok, past_key_values=past, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    sync()
    t0 = time.perf_counter()
    for _ in range(gen):
        out = model(input_ids=tok, past_key_values=past, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    sync()
    return batch * gen / (time.perf_counter() - t0)


@torch.no_grad()
def compiled_decode(model, cfg, batch, prompt, gen):
    max_len = prompt + gen + 8
    cache = StaticCache(config=cfg, max_batch_size=batch, max_cache_len=max_len, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda")
    pos = torch.arange(prompt, device="cuda")
    out = model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)

    def step(tok, cache_position):
        return model(input_ids=tok, past_key_values=cache, cache_position=cache_position, use_cache=True).logits

    step_c = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    p = prompt
    for _ in range(4):  # compile + capture
        torch.compiler.cudagraph_mark_step_begin()
        logits = step_c(tok, torch.tensor([p], device="cuda"))
        tok = logits[:, -1:].argmax(-1)
        p += 1
    sync()
    n = min(gen, max_len - p - 1)
    t0 = time.perf_counter()
    for _ in range(n):
        torch.compiler.cudagraph_mark_step_begin()
        logits = step_c(tok, torch.tensor([p], device="cuda"))
        tok = logits[:, -1:].argmax(-1)
        p += 1
    sync()
    return batch * n / (time.perf_counter() - t0)


@torch.no_grad()
def eager_prefill(model, cfg, n):
    ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
    model(input_ids=ids, use_cache=False)
    sync()
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        sync()
        best = min(best, time.perf_counter() - t0)
    return n / best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--batch", default="1")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--prefill", type=int, default=0)
    a = ap.parse_args()
    model, cfg = build(a.shape)
    base = {"peer": "hf-transformers " + transformers.__version__, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(), "shape": a.shape, "prompt": a.prompt, "gen": a.gen}
    if a.prefill:
        print(json.dumps({**base, "mode": "eager-sdpa prefill", "tokens": a.prefill,
                          "prefill_tok_s": round(eager_prefill(model, cfg, a.prefill), 1)}), flush=True)
    batches = [int(x) for x in a.batch.split(",")]
    for b in batches:  # eager first: compiling takes long and may be cut off by the caller's time limit
        print(json.dumps({**base, "mode": "eager decode", "batch": b,
                          "decode_tok_s": round(eager_decode(model, cfg, b, a.prompt, a.gen), 1)}), flush=True)
    for b in batches if a.compile else []:
        print(json.dumps({**base, "mode": "torch.compile reduce-overhead StaticCache decode", "batch": b,
                          "decode_tok_s": round(compiled_decode(model, cfg, b, a.prompt, a.gen), 1)}), flush=True)


if __name__ == "__main__":
    main()
