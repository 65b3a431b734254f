"""Rollout throughput on a GPU: offline vLLM, one LoRA per role (``VLLMLM``), against ``LocalLM`` on the same prompts.

Needs a CUDA GPU and ``pip install 'rolecall[gpu]'``; on a machine without them it says so and exits 2. Both LMs load
the same base model (the embedded SmolLM2-135M-Instruct by default) with the same role adapters (``--roles``, each
with its LoRA B perturbed so no adapter is the identity), and answer the same group-sampling workload in the same
process: ``--prompts`` role-formatted prompts spread over the roles, ``--group-size`` samples each at temperature 1
with log-probs (what an RL step's generate phase asks), through ``lm.for_role(role).sample(...)`` from one thread per
role, as the optimizers call it:

    .venv/bin/python benchmarks/bench_vllm.py                         # 64 prompts x G=8, 4 roles, 128 new tokens
    .venv/bin/python benchmarks/bench_vllm.py --prompts 256 --group-size 16

It reports generated tokens/s of each, the vLLM / LocalLM ratio, and the seconds one adapter publish (write + reload)
takes, in ``benchmarks/results/bench_vllm.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _common import bench_parser, write_results

SUBJECTS = ["Varn", "Ostrel", "Keldamar", "Thessaly", "Ambrun", "Quillon", "Marrow Fen", "Ilsebeth"]


def prompts_for(role: str, count: int) -> list[list[dict[str, str]]]:
    """``count`` short role prompts (a system line naming the role, a question)."""
    return [
        [
            {"role": "system", "content": f"You are the {role} agent of a multi-hop QA team. Answer briefly."},
            {"role": "user", "content": f"Question {i}: who founded the company that built {SUBJECTS[i % 8]}?"},
        ]
        for i in range(count)
    ]


def perturb(lm: Any, role: str, seed: int) -> None:
    """Give adapter ``role`` small non-zero LoRA B weights, so it is not routed to the base model."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lm.backend.model.named_parameters():
            if f".{role}." in name and "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen).to(p) * 1e-3)
    lm.backend.mark_updated(role)


def run_workload(lm: Any, roles: Sequence[str], prompts: int, group: int, max_tokens: int) -> dict[str, float]:
    """Generate the workload once; returns seconds and generated tokens."""
    per_role = max(1, prompts // len(roles))

    def one(role: str) -> int:
        groups = lm.for_role(role).sample(prompts_for(role, per_role), n=group, temperature=1.0,
                                          max_tokens=max_tokens, seed=0, logprobs=True)  # fmt: skip
        return sum(c.completion_tokens for g in groups for c in g)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(roles)) as pool:
        tokens = sum(pool.map(one, roles))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": float(tokens), "tokens_per_s": tokens / seconds}


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__, "bench_vllm")
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct", help="base model (default: %(default)s)")
    parser.add_argument("--roles", default="plan,analysis,rewrite,synthesis", help="adapters (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts in the workload (default: %(default)s)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per sample (default: %(default)s)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="timed rounds of each, alternating (default: %(default)s)"
    )
    args: argparse.Namespace = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_vllm: no CUDA GPU here; run it on a GPU machine with pip install 'rolecall[gpu]'", file=sys.stderr)
        return 2
    from rolecall.lm import LocalLM
    from rolecall.lm.vllm import VLLMLM

    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    lms = {"local": LocalLM(args.model, cache=False, max_batch_rows=256), "vllm": VLLMLM(args.model)}
    for lm in lms.values():
        for i, role in enumerate(roles):
            lm.for_role(role)
            perturb(lm, role, seed=i)
    for lm in lms.values():  # warm-up: compile kernels, fill caches
        run_workload(lm, roles, len(roles), 2, 16)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in lms}
    for _ in range(args.rounds):
        for name, lm in lms.items():
            runs[name].append(run_workload(lm, roles, args.prompts, args.group_size, args.max_tokens))
            print(f"{name:>5}: {runs[name][-1]['tokens_per_s']:.0f} tok/s")
    best = {name: max(r["tokens_per_s"] for r in rs) for name, rs in runs.items()}
    vllm_lm = lms["vllm"]
    start = time.perf_counter()
    perturb(vllm_lm, roles[0], seed=99)  # mark_updated publishes the adapter to vLLM
    publish_s = time.perf_counter() - start
    results = {
        "runs": runs,
        "tokens_per_s": best,
        "ratio_vllm_over_local": best["vllm"] / best["local"],
        "publish_s": publish_s,
        "gpu": torch.cuda.get_device_name(0),
    }
    out = write_results(results, args)
    print(f"vLLM / LocalLM: {results['ratio_vllm_over_local']:.1f}x; one adapter publish {publish_s:.2f} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
