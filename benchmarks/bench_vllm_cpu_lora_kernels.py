"""vLLM's CPU LoRA kernels against rolecall's grouped ones (``rolecall/vllm_plugin.py``), kernel by kernel, in one
process: the shrink + expand pair of each LoRA projection of SmolLM2-135M (q, k, v, o, gate, up, down; rank 8, 8
adapter slots) summed over its 30 layers, for decode-sized batches (24 tokens) and prefill-sized ones (512 and 2,048
tokens), with one adapter and with four mixed, in bf16 and fp32.

    .venv/bin/python benchmarks/bench_vllm_cpu_lora_kernels.py      # run it alone on the machine

Writes ``benchmarks/results/vllm_cpu_lora_kernels.json``: milliseconds per forward pass for each kernel set and the
ratio vLLM / grouped (above 1: the grouped kernels are faster). Inputs are random; the test suite checks that both
kernel sets compute the same thing (``tests/test_vllm_plugin.py``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from _common import bench_parser, write_results

LAYERS, SLOTS, RANK = 30, 8, 8
#: (input, output) sizes of SmolLM2-135M's LoRA projections: q, k, v, o, gate, up, down.
PROJECTIONS = ((576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576))


def per_pass_ms(shrink: Callable, expand: Callable, tokens: int, adapters: int, dtype: Any, repeats: int) -> float:
    """Milliseconds for one model pass's LoRA work (every projection, every layer) on ``tokens`` tokens."""
    import torch

    gen = torch.Generator().manual_seed(tokens * 10 + adapters)
    indices = torch.randint(0, adapters, (tokens,), generator=gen)
    weights = [
        (
            torch.randn(SLOTS, 1, RANK, i, generator=gen).to(dtype),
            torch.randn(SLOTS, 1, o, RANK, generator=gen).to(dtype),
        )
        for i, o in PROJECTIONS
    ]
    inputs = {i: torch.randn(tokens, i, generator=gen).to(dtype) for i, _ in PROJECTIONS}
    outputs = {o: torch.zeros(tokens, o, dtype=dtype) for _, o in PROJECTIONS}
    buffer = torch.zeros(tokens, RANK)

    def one_layer() -> None:
        for (i, o), (a, b) in zip(PROJECTIONS, weights, strict=True):
            shrink(inputs[i], a, buffer, indices, 1.0)
            expand(buffer, b, outputs[o], indices, True)

    one_layer()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        one_layer()
    return (time.perf_counter() - start) / repeats * LAYERS * 1e3


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__, "vllm_cpu_lora_kernels")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    args = parser.parse_args(argv)
    import torch
    from vllm.lora.ops import torch_ops

    from rolecall import vllm_plugin

    torch.set_num_threads(args.threads)
    vllm_plugin.register()
    kernels = {
        "vllm": (torch_ops.bgmv_shrink, torch_ops.bgmv_expand),
        "grouped": (vllm_plugin.bgmv_shrink, vllm_plugin.bgmv_expand),
    }
    results: dict[str, Any] = {"cases": []}
    for dtype in (torch.bfloat16, torch.float32):
        for tokens in (24, 512, 2048):
            for adapters in (1, 4):
                repeats = 20 if tokens < 100 else 2
                row: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "tokens": tokens,
                                       "adapters": adapters}  # fmt: skip
                for name, (shrink, expand) in kernels.items():
                    row[f"{name}_ms"] = per_pass_ms(shrink, expand, tokens, adapters, dtype, repeats)
                row["vllm_over_grouped"] = row["vllm_ms"] / row["grouped_ms"]
                results["cases"].append(row)
                print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(f"wrote {write_results(results, args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
