"""Decode-step time with transformers' DynamicCache (re-concatenates the whole cache every token) vs rolecall's growable
cache (appends into preallocated slack), on the embedded SmolLM2-135M-Instruct, in one process:

    .venv/bin/python benchmarks/bench_kv_cache.py                    # 16 rows, 1,500 cached tokens each
    .venv/bin/python benchmarks/bench_kv_cache.py --rows 8 --context 3000

The two caches are timed in alternation (three rounds each) from the same random KV contents; the script checks the
logits agree and prints milliseconds per decode step and the dynamic / growable ratio (target > 1.2 at 16 x 1,500),
and writes ``benchmarks/results/bench_kv_cache.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from rolecall.lm.backend import ModelBackend
from rolecall.lm.generation import BASE_ADAPTER, _cache_kwarg, decode_step, new_cache

from _common import bench_parser, write_results


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time decode steps over a filled cache of each kind; returns the measurements."""
    from transformers import DynamicCache

    backend = ModelBackend("embedded:smollm2-135m-instruct", dtype=args.dtype, batching="static")
    model, cfg = backend.model, backend.model.config
    dtype = next(model.parameters()).dtype
    layers, heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(0)
    kv = [
        tuple(torch.randn(args.rows, heads, args.context, head_dim, generator=g).to(dtype) for _ in range(2))
        for _ in range(layers)
    ]
    cache_kw = _cache_kwarg(model)
    times: dict[str, list[float]] = {"dynamic": [], "growable": []}
    logits: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, make in (("growable", new_cache), ("dynamic", DynamicCache)):
                cache = make()
                for i, (k, v) in enumerate(kv):
                    cache.update(k.clone(), v.clone(), i)
                attention = torch.ones(args.rows, args.context, dtype=torch.long)
                pos = torch.full((args.rows,), args.context)
                tokens, adapters = [5] * args.rows, [BASE_ADAPTER] * args.rows
                for _ in range(2):  # warm-up: allocation, kernels
                    cache, attention, pos, out = decode_step(model, cache, attention, pos, tokens, adapters, cache_kw)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    cache, attention, pos, out = decode_step(model, cache, attention, pos, tokens, adapters, cache_kw)
                times[name].append((time.perf_counter() - t0) / args.steps)
                logits[name] = out
    agree = bool(torch.allclose(logits["dynamic"], logits["growable"], atol=1e-2, rtol=1e-2))
    result = {
        name: {"ms_per_step": 1000 * statistics.median(t), "rounds_ms": [1000 * x for x in t]}
        for name, t in times.items()
    }
    result["ratio"] = result["dynamic"]["ms_per_step"] / result["growable"]["ms_per_step"]
    result["logits_agree"] = agree
    result["dtype"] = str(dtype)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_kv_cache")
    parser.add_argument("--rows", type=int, default=16, help="batch rows (default 16)")
    parser.add_argument("--context", type=int, default=1500, help="cached tokens per row (default 1500)")
    parser.add_argument("--steps", type=int, default=12, help="timed decode steps per round (default 12)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per cache kind (default 3)")
    parser.add_argument("--dtype", default="auto", help="model dtype: auto, float32, bfloat16")
    args = parser.parse_args(argv)
    print(f"bench_kv_cache: {args.rows} rows x {args.context} cached tokens, embedded SmolLM2-135M")
    r = run(args)
    print(f"  dynamic  {r['dynamic']['ms_per_step']:6.0f} ms/step")
    print(f"  growable {r['growable']['ms_per_step']:6.0f} ms/step")
    print(f"dynamic / growable = {r['ratio']:.2f}x  (target > 1.2); logits agree: {r['logits_agree']}")
    print(f"wrote {write_results(r, args)}")


if __name__ == "__main__":
    main()
