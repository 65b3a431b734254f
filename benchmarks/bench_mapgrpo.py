"""MAPGRPO-compiled OPERA vs prompt-only OPERA vs BootstrapFewShot-compiled OPERA on held-out synthetic questions.

Same embedded model (SmolLM2-135M-Instruct), same BM25 retriever, same held-out test questions for all three, in one
process:

    .venv/bin/python benchmarks/bench_mapgrpo.py                         # 100 questions, 20-minute MAPGRPO budget
    .venv/bin/python benchmarks/bench_mapgrpo.py --questions 16 --budget-minutes 5   # a quick look

Prints EM / F1 / cover-EM / success rate of each and the EM differences (target: MAPGRPO >= prompt-only + 10 points
and > BootstrapFewShot), and writes ``benchmarks/results/bench_mapgrpo.json``. Progress (evaluation records, the
BootstrapFewShot program, MAPGRPO's log and checkpoints) lives under ``benchmarks/results/bench_mapgrpo_run/``: a
killed run resumes where it stopped (a resumed MAPGRPO compile gets a fresh time budget for its remaining stages;
``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Sequence
from typing import Any

import dspy

from rolecall.data.synthetic import synthetic_world
from rolecall.evaluation import evaluate
from rolecall.evaluation.metrics import exact_match
from rolecall.lm import LocalLM
from rolecall.optimizers import MAPGRPO, MAPGRPOConfig
from rolecall.programs import OPERA
from rolecall.retrievers.bm25 import BM25

from _common import bench_parser, write_results


def _metrics(result: Any) -> dict[str, float]:
    s = result.summary.to_dict()
    return {k: s[k] for k in ("em", "f1", "cover_em", "success_rate", "lm_calls", "latency_s") if k in s}


def _em_metric(example: dspy.Example, prediction: dspy.Prediction, trace: Any = None) -> float:
    return exact_match(str(getattr(prediction, "answer", "") or ""), list(example.answers))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Prompt-only, BootstrapFewShot and MAPGRPO OPERA on the same held-out questions.

    Every phase keeps its work under ``RUN_DIR`` (the evaluation records, the BootstrapFewShot program, MAPGRPO's
    checkpoints), so a killed benchmark picks up where it stopped; ``--fresh`` starts over.
    """
    run_dir = args.out.parent / "bench_mapgrpo_run"
    if args.fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    world = synthetic_world(seed=args.seed)
    held_out = world.test[: args.questions]
    retriever = BM25(world.corpus)
    lm = LocalLM()
    results: dict[str, Any] = {"questions": len(held_out)}

    def score(name: str, program: Any) -> None:
        t0 = time.perf_counter()
        with dspy.context(lm=lm):
            res = evaluate(
                program,
                held_out,
                num_threads=args.threads,
                show_progress=True,
                output_dir=run_dir / "eval" / name,
                resume=True,
            )
        results[name] = {**_metrics(res), "eval_s": time.perf_counter() - t0, "questions_run_now": res.summary.n_run}
        print(f"  {name:<18} EM {results[name]['em']:.3f}  F1 {results[name]['f1']:.3f}", flush=True)

    score("prompt_only", OPERA(retriever, lm=lm))

    saved = run_dir / "bootstrap_program"
    if (saved / "program.json").is_file():
        bfs = OPERA.load(saved, retriever=retriever, lm=lm)
        results["bootstrap_compile_s"] = "resumed"
    else:
        t0 = time.perf_counter()
        bootstrap = dspy.BootstrapFewShot(
            metric=_em_metric, max_bootstrapped_demos=3, max_labeled_demos=3, max_rounds=1
        )
        with dspy.context(lm=lm):
            bfs = bootstrap.compile(
                OPERA(retriever, lm=lm), trainset=[e.to_dspy() for e in world.train[: args.bootstrap_train]]
            )
        results["bootstrap_compile_s"] = time.perf_counter() - t0
        bfs.save(saved)
    score("bootstrap_fewshot", bfs)

    t0 = time.perf_counter()
    config = MAPGRPOConfig(
        group_size=args.group_size,
        time_budget_minutes=args.budget_minutes,
        expert_gradient=True,  # off-policy guidance (c_best gets a gradient), not the paper's Eq. 11
        output_dir=run_dir,
        num_threads=args.threads,
        seed=args.seed,
        resume=True,
    )
    optimizer = MAPGRPO(config)
    trained = OPERA(retriever, lm=lm).compile(optimizer=optimizer, trainset=world.train)
    results["mapgrpo_train_s"] = time.perf_counter() - t0
    log_path = run_dir / "metrics.jsonl"
    results["mapgrpo_log"] = (
        [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
        if log_path.is_file()
        else optimizer.history
    )
    score("mapgrpo", trained)

    results["em_gain_vs_prompt_only"] = results["mapgrpo"]["em"] - results["prompt_only"]["em"]
    results["em_gain_vs_bootstrap"] = results["mapgrpo"]["em"] - results["bootstrap_fewshot"]["em"]
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_mapgrpo")
    parser.add_argument("--questions", type=int, default=100, help="held-out test questions (default 100)")
    parser.add_argument("--budget-minutes", type=float, default=20.0, help="MAPGRPO wall-clock budget (default 20)")
    parser.add_argument("--group-size", type=int, default=4, help="MAPGRPO group size (default 4)")
    parser.add_argument("--bootstrap-train", type=int, default=24, help="train questions BootstrapFewShot may use")
    parser.add_argument("--threads", type=int, default=16, help="concurrent questions (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="world and training seed (default 0)")
    parser.add_argument("--fresh", action="store_true", help="discard saved progress (records, checkpoints) first")
    args = parser.parse_args(argv)
    print(f"bench_mapgrpo: {args.questions} held-out synthetic questions, embedded SmolLM2-135M")
    results = run(args)
    print(f"\nEM gain vs prompt-only: {results['em_gain_vs_prompt_only'] * 100:+.1f} points (target >= +10)")
    print(f"EM gain vs BootstrapFewShot: {results['em_gain_vs_bootstrap'] * 100:+.1f} points (target > 0)")
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
