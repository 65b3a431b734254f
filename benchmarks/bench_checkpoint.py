"""Cost of the per-step training checkpoint: every adapter and trainer state written again, against only the ones the
step changed (the others hard-linked from the previous checkpoint).

The training core checkpoints after every optimizer step. With SFT's 2-sample steps on OPERA's four adapters (plan,
analysis, synthesis, rewrite) on 2 CPU cores, the full write took ~0.5 s of each ~2 s step. This bench puts four
role adapters with AdamW states on one embedded SmolLM2-135M-Instruct, then alternates the two kinds of write, each
into its own folder, one changed adapter per step as in training (``keep=2``, so the links can be counted), so
machine noise hits both alike. Prints the median seconds and the new bytes per checkpoint of each and their ratio,
and writes ``benchmarks/results/bench_checkpoint.json``.

Example:
    .venv/bin/python benchmarks/bench_checkpoint.py --steps 8
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from _common import bench_parser, write_results

ADAPTERS = ("plan", "analysis", "synthesis", "rewrite")


def new_bytes(checkpoint: Path) -> int:
    """Bytes of the files in ``checkpoint`` that are not hard links shared with an older checkpoint."""
    return sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file() and p.stat().st_nlink == 1)


def main() -> None:
    parser = bench_parser(__doc__, "bench_checkpoint")
    parser.add_argument("--steps", type=int, default=8, help="timed checkpoints of each kind (default 8)")
    args = parser.parse_args()

    from rolecall.lm import LocalLM
    from rolecall.optimizers.core import AdapterTrainer, TrainerConfig, TrainingSample
    from rolecall.optimizers.core.checkpoint import save_checkpoint

    lm = LocalLM()
    backend = lm.backend
    config = TrainerConfig(loss="nll", learning_rate=2e-3, micro_batch_size=2, gradient_accumulation_steps=1)
    trainers = {name: AdapterTrainer(backend, name, config) for name in ADAPTERS}
    sample_ids = backend.tokenizer("The capital of France is Paris.", add_special_tokens=False)["input_ids"]
    for name, trainer in trainers.items():  # one real step each: non-zero LoRA B and AdamW moments to save
        trainer.step([TrainingSample(role=name, adapter=name, prompt_ids=sample_ids, completion_ids=sample_ids)] * 2)

    seconds: dict[str, list[float]] = {"full": [], "changed_only": []}
    written: dict[str, list[int]] = {"full": [], "changed_only": []}
    with tempfile.TemporaryDirectory() as tmp:
        for step in range(args.steps + 1):  # step 0 writes the first (full) checkpoint of both: untimed
            changed = ADAPTERS[step % len(ADAPTERS)]
            for kind in seconds:
                fresh = None if kind == "full" or step == 0 else {changed}
                started = time.perf_counter()
                path = save_checkpoint(Path(tmp) / kind, step, backend=backend, adapters=list(ADAPTERS),
                                       trainers=trainers, state={"global_step": step}, keep=2,
                                       fresh_adapters=fresh, fresh_trainers=fresh)  # fmt: skip
                elapsed = time.perf_counter() - started
                if step:
                    seconds[kind].append(elapsed)
                    written[kind].append(new_bytes(path))
    median = {k: statistics.median(v) for k, v in seconds.items()}
    megabytes = {k: statistics.median(v) / 2**20 for k, v in written.items()}
    ratio = median["full"] / median["changed_only"]
    for kind in seconds:
        print(f"{kind:13s} median {median[kind]:.3f} s, {megabytes[kind]:.1f} MB written per checkpoint")
    print(f"full / changed-only: {ratio:.2f}x")
    out = write_results(
        {"adapters": list(ADAPTERS), "seconds": seconds, "median_s": median, "median_mb_written": megabytes,
         "full_over_changed_only": ratio},
        args,
    )  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
