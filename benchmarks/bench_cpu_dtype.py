"""What ``dtype="auto"`` should pick on this CPU: bf16 against fp32, in one process.

bf16 pays on a CPU only where it multiplies bf16 in hardware (AVX512-BF16 or AMX). oneDNN runs bf16 on any
AVX-512 CPU, emulated, and its check (``torch.ops.mkldnn._is_mkldnn_bf16_supported``) says yes there too. This
script times, in both dtypes:

- a prefill-shaped matmul (256 x 576 @ 576 x 1536, SmolLM2-135M's MLP) and a decode-shaped one (4 rows);
- the embedded SmolLM2-135M generating: ``--calls`` concurrent ``dspy.Predict`` calls through LocalLM, greedy.

    .venv/bin/python benchmarks/bench_cpu_dtype.py

It prints each rate and the bf16 / fp32 ratios, the CPU's bf16 flags and what ``auto`` now picks, and writes them to
``benchmarks/results/bench_cpu_dtype.json``. Run it alone on the machine.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy
import torch

from rolecall.lm import LocalLM
from rolecall.lm.backend import _pick_dtype, cpu_has_native_bf16

from _common import bench_parser, write_results

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def matmul_rate(dtype: torch.dtype, rows: int, repeats: int) -> float:
    """GFLOP/s of ``rows`` x 576 @ 576 x 1536 in ``dtype`` (best of three timings of ``repeats`` products)."""
    a, w = torch.randn(rows, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    for _ in range(3):
        a @ w
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ w
        best = min(best, (time.perf_counter() - t0) / repeats)
    return 2 * rows * 576 * 1536 / best / 1e9


def generation_rate(dtype: str, calls: int, max_tokens: int) -> dict[str, Any]:
    """Completion tokens per second of ``calls`` concurrent greedy Predict calls on the embedded model."""
    lm = LocalLM(dtype=dtype, cache=False, max_tokens=max_tokens, max_batch_rows=calls)
    predict = dspy.Predict("question -> answer")
    questions = [f"Which river flows through city number {i}?" for i in range(calls)]

    def ask(q: str) -> None:
        with dspy.context(lm=lm):
            try:
                predict(question=q)
            except Exception:  # noqa: BLE001 - a parse failure still generated its tokens
                pass

    ask("What is the capital of Germany?")  # warm-up
    start = len(lm.history)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=calls) as pool:
        list(pool.map(ask, questions))
    wall = time.perf_counter() - t0
    tokens = sum((h.get("usage") or {}).get("completion_tokens", 0) for h in lm.history[start:])
    return {"wall_s": round(wall, 2), "completion_tokens": tokens, "tokens_per_s": round(tokens / wall, 1)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_cpu_dtype")
    parser.add_argument("--calls", type=int, default=16, help="concurrent Predict calls (default 16)")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion budget per call (default 48)")
    args = parser.parse_args(argv)
    flags = {name: bool(getattr(torch.cpu, name)()) for name in dir(torch.cpu) if name.startswith("_is_")}
    flags["mkldnn_bf16_supported"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    results: dict[str, Any] = {"cpu_flags": flags, "native_bf16": cpu_has_native_bf16(),
                               "auto_picks": str(_pick_dtype("auto", torch.device("cpu")))}  # fmt: skip
    print(f"bench_cpu_dtype: native bf16 {results['native_bf16']}, auto picks {results['auto_picks']}")
    for name, dtype in DTYPES.items():
        results[name] = {
            "prefill_gflops": round(matmul_rate(dtype, 256, 20), 1),
            "decode_gflops": round(matmul_rate(dtype, 4, 400), 1),
            "generation": generation_rate(name, args.calls, args.max_tokens),
        }
        print(f"  {name:<9} prefill {results[name]['prefill_gflops']:6.1f} GFLOP/s  decode "
              f"{results[name]['decode_gflops']:6.1f} GFLOP/s  generation "
              f"{results[name]['generation']['tokens_per_s']:6.1f} tok/s")  # fmt: skip
    b, f = results["bfloat16"], results["float32"]
    results["bf16_over_fp32"] = {
        "prefill": round(b["prefill_gflops"] / f["prefill_gflops"], 2),
        "decode": round(b["decode_gflops"] / f["decode_gflops"], 2),
        "generation": round(b["generation"]["tokens_per_s"] / f["generation"]["tokens_per_s"], 2),
    }
    print(f"bf16 / fp32: {results['bf16_over_fp32']}")
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
