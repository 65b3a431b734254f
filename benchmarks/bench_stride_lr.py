"""Which learning rates does STRIDE-FT's LoRA need on this model? A small sweep on held-out samples, in one process.

STRIDE-FT trained its Meta-Planner's DPO at 3e-5 and its SFT legs at 1e-4, 20-70x below the 2e-3 SFT(gold) measured
for this LoRA, and 3-4 DPO steps at a margin of 0.03 moved nothing. This sweep calibrates both on the samples
STRIDE-FT itself selects:

1. the warm start: STRIDE trained with SFT(gold) (``--warm-start DIR`` for a saved one);
2. one collection: STRIDE-FT's N sampled plans per training question, executed and scored, its selection rules
   applied (``samples.jsonl`` under ``--runs``; a second run reuses it);
3. each leg's samples split 80/20 by a hash of the prompt (identical prompts stay on one side);
4. for every learning rate, the warm-start adapter trained for ``--steps`` optimizer steps on the 80% and judged on
   the 20%: the SFT legs by their held-out per-token NLL (lower is better), the Meta-Planner's DPO by the held-out
   preference accuracy and mean implicit-reward margin beta * [(log pi - log pi_ref)(chosen) - (same)(rejected)],
   and the chosen plans' NLL (a DPO that only pushes the rejected plan down while the chosen one falls too shows here).

The rate a leg should use is the one with the best held-out number; the result JSON records every rate's numbers
(``benchmarks/results/bench_stride_lr.json``).

    .venv/bin/python benchmarks/bench_stride_lr.py --questions 40 --num-plans 8 --steps 12
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import bench_parser, finished_training, sft_optimizer, trained_once, write_results

RUNS = Path(__file__).resolve().parent.parent / "runs" / "bench_stride_lr"


def held_out_split(samples: list[Any], fraction: float = 0.2) -> tuple[list[Any], list[Any]]:
    """(train, held-out): a sample is held out when the hash of its prompt ids falls in the first ``fraction``."""
    train, held = [], []
    for s in samples:
        digest = hashlib.sha256(str(s.prompt_ids).encode()).digest()
        (held if digest[0] < 256 * fraction else train).append(s)
    return train, held


def nll(trainer: Any, samples: list[Any]) -> float:
    """Mean per-token negative log-likelihood of the samples' completions (loss-mask tokens) under the adapter."""
    total = count = 0.0
    for s, logps in zip(samples, trainer.policy_logps(samples), strict=True):
        mask = s.loss_mask or [1] * len(s.completion_ids)
        total -= sum(lp for lp, m in zip(logps, mask, strict=True) if m)
        count += sum(mask)
    return total / max(1.0, count)


def dpo_judgement(trainer: Any, pairs: list[Any], beta: float) -> dict[str, float]:
    """Held-out preference accuracy, mean implicit-reward margin and the chosen completions' NLL."""
    plain = {"rejected_ids": None, "rejected_loss_mask": None, "rejected_ref_logps": None}
    chosen = [replace(p, **plain) for p in pairs]
    rejected = [replace(p, completion_ids=p.rejected_ids, loss_mask=p.rejected_loss_mask,
                        ref_logps=p.rejected_ref_logps, **plain) for p in pairs]  # fmt: skip
    # each side scored alone: a DPO trainer refuses a sample without its pair, so score through an NLL view of the
    # same adapter (a second AdapterTrainer holds its own AdamW and changes no weight)
    scorer = type(trainer)(trainer.backend, trainer.adapter, replace(trainer.config, loss="nll"))
    margins = []
    scored = zip(chosen, rejected, scorer.policy_logps(chosen), scorer.policy_logps(rejected), strict=True)
    for c, r, lc, lr in scored:
        gain_c = sum(lc) - sum(c.ref_logps or [0.0] * len(lc))
        gain_r = sum(lr) - sum(r.ref_logps or [0.0] * len(lr))
        margins.append(beta * (gain_c - gain_r))
    n = max(1, len(margins))
    return {"accuracy": sum(m > 0 for m in margins) / n, "margin": sum(margins) / n, "chosen_nll": nll(scorer, chosen)}


def main() -> None:
    parser = bench_parser(__doc__, "bench_stride_lr")
    parser.add_argument("--questions", type=int, default=40, help="training questions collected (default 40)")
    parser.add_argument("--num-plans", type=int, default=8, help="STRIDE-FT's N plans per question (default 8)")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per learning rate (default 12)")
    parser.add_argument("--sft-rates", default="1e-4,5e-4,2e-3,5e-3", help="SFT legs' rates to try")
    parser.add_argument("--dpo-rates", default="3e-5,3e-4,1e-3,3e-3", help="the Meta-Planner DPO's rates to try")
    parser.add_argument("--warm-start", type=Path, default=None, help="a saved SFT(gold) STRIDE program")
    parser.add_argument("--sft-max-steps", default="60", help="the warm start's SFT(gold) steps per adapter")
    parser.add_argument("--threads", type=int, default=16, help="program runs at once in the collection")
    parser.add_argument("--runs", type=Path, default=RUNS, help="where the warm start and the collection go")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm.engines import make_lm
    from rolecall.optimizers import STRIDEFT, STRIDEFTConfig
    from rolecall.optimizers.core.samples import load_samples
    from rolecall.optimizers.core.trainer import AdapterTrainer
    from rolecall.programs import STRIDE
    from rolecall.retrievers.bm25 import BM25

    world = synthetic_world(seed=0)
    retriever = BM25(world.corpus)
    train = world.train[: args.questions]

    def load(path: Path) -> Any:
        return STRIDE.load(path, retriever=retriever, lm=make_lm(engine="local"))

    warm = args.warm_start
    if warm is None:
        folder = args.runs / "sft"
        args.max_steps, args.epochs, args.budget_minutes = args.sft_max_steps, 1000.0, 60.0

        def train_sft() -> tuple[Any, Any]:
            sft = sft_optimizer(args, folder, resume=True)  # a killed sweep picks its warm start up again
            return STRIDE(retriever, lm=make_lm(engine="local")).compile(optimizer=sft, trainset=world.train), sft

        trained_once(folder, load, train_sft, reuse=finished_training(folder))
        warm = folder / "program"
    collect = args.runs / "collect"
    started = time.perf_counter()
    if not (collect / "samples.jsonl").is_file():  # collection only: the budget stops it before any update
        config = STRIDEFTConfig(num_plans=args.num_plans, output_dir=collect, num_threads=args.threads,
                                time_budget_minutes=1e-6, resume=True)  # fmt: skip
        ft = STRIDEFT(config)
        load(warm).compile(optimizer=ft, trainset=train)
    collect_minutes = (time.perf_counter() - started) / 60
    by_adapter = load_samples(collect / "samples.jsonl")
    selection = (collect / "selection.json").read_text() if (collect / "selection.json").is_file() else "{}"
    print(f"collection: {collect_minutes:.1f} min, samples per adapter "
          f"{ {a: len(s) for a, s in by_adapter.items()} }", flush=True)  # fmt: skip

    results: dict[str, Any] = {"collection_minutes": round(collect_minutes, 2), "selection": selection, "legs": {}}
    defaults = STRIDEFTConfig()
    for adapter, samples in by_adapter.items():
        for leg in sorted({"meta_planner" if s.role in ("meta_planner", "planner") else s.role for s in samples}):
            pool = [s for s in samples if ("meta_planner" if s.role in ("meta_planner", "planner") else s.role) == leg]
            fit, held = held_out_split(pool)
            if not fit or not held:
                print(f"{leg}: {len(pool)} samples, too few to hold some out; skipped", flush=True)
                continue
            dpo = leg == "meta_planner"
            rates = [float(r) for r in (args.dpo_rates if dpo else args.sft_rates).split(",")]
            rows = []
            for rate in rates:
                program = load(warm)  # the warm-start adapter afresh for every rate
                config = replace(STRIDEFT(defaults).trainer_config(leg), learning_rate=rate)
                trainer = AdapterTrainer(program.lm.backend, adapter, config)
                before = dpo_judgement(trainer, held, defaults.beta) if dpo else {"nll": nll(trainer, held)}
                losses = []
                for step in range(args.steps):
                    batch = [fit[(step * trainer.config.samples_per_step + i) % len(fit)]
                             for i in range(trainer.config.samples_per_step)]  # fmt: skip
                    losses.append(trainer.step(batch)["loss/total"])
                after = dpo_judgement(trainer, held, defaults.beta) if dpo else {"nll": nll(trainer, held)}
                rows.append({"learning_rate": rate, "before": before, "after": after,
                             "train_loss_first": losses[0], "train_loss_last": losses[-1]})  # fmt: skip
                shown = ", ".join(f"{k} {v:.4f}" for k, v in after.items())
                print(f"{leg} lr {rate:g}: held-out {shown} (before: "
                      f"{', '.join(f'{k} {v:.4f}' for k, v in before.items())})", flush=True)  # fmt: skip
            key = (lambda r: -r["after"]["margin"]) if dpo else (lambda r: r["after"]["nll"])
            finite = [r for r in rows if all(math.isfinite(v) for v in r["after"].values())]
            best = min(finite, key=key)["learning_rate"] if finite else None
            results["legs"][leg] = {"samples": len(pool), "fit": len(fit), "held_out": len(held), "steps": args.steps,
                                    "rates": rows, "best_rate": best}  # fmt: skip
            print(f"{leg}: best learning rate {best}", flush=True)
    out = write_results(results, args)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
