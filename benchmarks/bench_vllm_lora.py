"""What a LoRA adapter costs each engine: the same 24 prompts (~900 tokens, 64 new tokens, greedy) as base-model
rows, as rows of one adapter, and as rows of four adapters mixed (a trained OPERA's plan / analysis / rewrite /
synthesis), first on vLLM with vLLM's own PyTorch LoRA kernels (``ROLECALL_VLLM_CPU_LORA=0``), then on vLLM with
rolecall's grouped kernels (``rolecall/vllm_plugin.py``, the default), then on LocalLM, in one process. Each adapter
has small random LoRA B weights, so no row is routed to the base model.

    .venv/bin/python benchmarks/bench_vllm_lora.py        # run it alone on the machine

Writes ``benchmarks/results/vllm_lora.json``: seconds and generated tokens/s of each case, per engine, and the
ratios. It is the per-phase evidence for rolecall's grouped CPU LoRA kernels (``rolecall/vllm_plugin.py``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from _common import bench_parser, write_results

ROLES = ("plan", "analysis", "rewrite", "synthesis")


def perturb(lm: Any, role: str, seed: int) -> None:
    """Give adapter ``role`` small random LoRA B weights (not the identity) and publish them."""
    import torch

    lm.for_role(role)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lm.backend.model.named_parameters():
            if f".{role}." in name and "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen).to(p) * 1e-3)
    lm.backend.mark_updated(role)


def run_cases(lm: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, dict[str, float]]:
    """Base rows, one adapter, four adapters mixed: one warm-up, then each case timed once."""
    from rolecall.lm.generation import GenerationRequest

    cases = {
        "base": [None] * len(prompts),
        "one_adapter": ["plan"] * len(prompts),
        "four_adapters": [ROLES[i % len(ROLES)] for i in range(len(prompts))],
    }
    lm.backend.generate([GenerationRequest(prompt_ids=prompts[0], max_tokens=8)])  # warm-up
    out: dict[str, dict[str, float]] = {}
    for name, adapters in cases.items():
        requests = [
            GenerationRequest(prompt_ids=p, max_tokens=max_tokens, adapter=a)
            for p, a in zip(prompts, adapters, strict=True)
        ]
        start = time.perf_counter()
        results = lm.backend.generate(requests)
        seconds = time.perf_counter() - start
        tokens = sum(r[0].completion_tokens for r in results)
        out[name] = {"seconds": seconds, "tokens": float(tokens), "tokens_per_s": tokens / seconds}
        print(f"{type(lm).__name__} {name}: {seconds:.1f} s, {tokens / seconds:.1f} tok/s", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__, "vllm_lora")
    parser.add_argument("--prompts", type=int, default=24, help="concurrent prompts (default: %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=900, help="tokens per prompt (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default: %(default)s)")
    args = parser.parse_args(argv)
    from rolecall.lm.engines import close_lm, make_lm

    results: dict[str, Any] = {}
    runs = {"vllm_torch_ops": ("vllm", "0"), "vllm": ("vllm", "1"), "local": ("local", "1")}
    for name, (engine, grouped) in runs.items():
        os.environ["ROLECALL_VLLM_CPU_LORA"] = grouped  # read by vLLM's engine process when it starts
        lm = make_lm(engine=engine, max_batch_rows=256)
        for i, role in enumerate(ROLES):
            perturb(lm, role, seed=i)
        text = "A passage about a fictional founder, the company she built and the city it stands in. " * 60
        base = lm.tokenizer(text, add_special_tokens=False)["input_ids"][: args.prompt_tokens - 4]
        prompts = [base + [100 + i] * 4 for i in range(args.prompts)]  # distinct tails: no prompt is a duplicate
        results[name] = run_cases(lm, prompts, args.max_tokens)
        close_lm(lm)
    ratios = {
        f"{engine}/{case}_vs_base": results[engine]["base"]["tokens_per_s"] / results[engine][case]["tokens_per_s"]
        for engine in results
        for case in ("one_adapter", "four_adapters")
    }
    for case in ("base", "one_adapter", "four_adapters"):
        vllm, local = results["vllm"][case], results["local"][case]
        ratios[f"vllm_over_local/{case}"] = vllm["tokens_per_s"] / local["tokens_per_s"]
        ratios[f"grouped_over_torch_ops/{case}"] = (
            vllm["tokens_per_s"] / results["vllm_torch_ops"][case]["tokens_per_s"]
        )
    results["ratios"] = ratios
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    print(f"wrote {write_results(results, args)}")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file again
    sys.exit(main())
