"""Does compiling make a program better? Prompt-only vs SFT(gold) on the synthetic world, in one process.

For each program (default: OPERA, the one with gold-path targets so far) on the embedded SmolLM2-135M:

1. prompt-only: the program with its built-in few-shot demos, evaluated on held-out test questions;
2. SFT(gold): the same program compiled with ``rolecall.optimizers.SFT`` on training questions (each adapter trained
   on its own demo-free prompts along the gold path, within a wall-clock budget), evaluated on the same questions.

Reported per row: EM with a question-bootstrap 95% interval, F1, training minutes, prompt tokens per LM call and LM
calls per question (demo-free prompts are the point of training), and each role's parse rate. Results go to
``benchmarks/results/bench_compile.json`` and a markdown table beside it; the compiled program is saved under
``--runs``.

Example:
    .venv/bin/python benchmarks/bench_compile.py --test-questions 50 --train-questions 200 --budget-minutes 12
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from _common import bench_parser, write_results

RUNS = Path(__file__).resolve().parent.parent / "runs" / "bench_compile"


def _row(name: str, method: str, summary: Any, train_minutes: float) -> dict[str, Any]:
    calls = summary.lm_calls or 1.0
    return {
        "program": name,
        "method": method,
        "n": summary.n,
        "em": summary.em,
        "em_ci": list(summary.em_ci),
        "f1": summary.f1,
        "train_minutes": round(train_minutes, 2),
        "prompt_tokens_per_call": round(summary.prompt_tokens / calls, 1),
        "lm_calls_per_question": round(summary.lm_calls, 2),
        "parse_rates": summary.parse_rates,
        "success_rate": summary.success_rate,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| program | method | n | EM | EM 95% CI | F1 | train min | prompt tokens / call | LM calls / question |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        low, high = r["em_ci"]
        lines.append(
            f"| {r['program']} | {r['method']} | {r['n']} | {r['em']:.3f} | {low:.2f}–{high:.2f} | {r['f1']:.3f} | "
            f"{r['train_minutes']:.1f} | {r['prompt_tokens_per_call']:.0f} | {r['lm_calls_per_question']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = bench_parser(__doc__, "bench_compile")
    parser.add_argument("--programs", default="opera", help="comma-separated registry names (default: opera)")
    parser.add_argument("--test-questions", type=int, default=200, help="held-out test questions (default 200)")
    parser.add_argument("--train-questions", type=int, default=400, help="training questions (default 400)")
    parser.add_argument("--budget-minutes", type=float, default=15.0, help="SFT wall-clock budget (default 15)")
    parser.add_argument("--epochs", type=float, default=2.0, help="SFT passes over each adapter's samples")
    parser.add_argument("--learning-rate", type=float, default=3e-4, help="SFT AdamW learning rate")
    parser.add_argument("--threads", type=int, default=16, help="questions evaluated concurrently (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic world (default 0)")
    parser.add_argument("--runs", type=Path, default=RUNS, help="where evaluation records and programs are written")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from rolecall.data.synthetic import synthetic_world
    from rolecall.evaluation import evaluate
    from rolecall.lm import LocalLM
    from rolecall.optimizers.sft import SFT
    from rolecall.programs.registry import build_program
    from rolecall.retrievers.bm25 import BM25
    from rolecall.utils.logs import quiet_repeated_warnings

    quiet_repeated_warnings()
    world = synthetic_world(seed=args.seed)
    test, train = world.test[: args.test_questions], world.train[: args.train_questions]
    retriever = BM25(world.corpus)
    rows: list[dict[str, Any]] = []
    for name in [p.strip() for p in args.programs.split(",") if p.strip()]:
        lm = LocalLM()  # a fresh base per program: adapters start untrained
        program = build_program(name, retriever, lm)
        before = evaluate(program, test, num_threads=args.threads, output_dir=args.runs / name / "prompt_only")
        rows.append(_row(name, "prompt-only", before.summary, 0.0))
        print(table(rows[-1:]), flush=True)
        sft = SFT(
            epochs=args.epochs,
            learning_rate=args.learning_rate,
            time_budget_minutes=args.budget_minutes,
            num_threads=args.threads,
            output_dir=str(args.runs / name / "sft"),
        )
        started = time.perf_counter()
        program.compile(optimizer=sft, trainset=train)
        minutes = (time.perf_counter() - started) / 60
        program.save(args.runs / name / "sft" / "program")
        after = evaluate(program, test, num_threads=args.threads, output_dir=args.runs / name / "sft_eval")
        rows.append(_row(name, "SFT(gold)", after.summary, minutes))
        rows[-1]["sft_steps"] = {r["adapter"]: r["step"] for r in sft.history}
        print(table(rows[-1:]), flush=True)
    results = {"rows": rows, "table": table(rows)}
    out = write_results(results, args)
    out.with_suffix(".md").write_text(table(rows))
    print(table(rows))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
