"""Do the offline optimizers help? STRIDE-FT and REAP's multi-task SFT, in one process on the synthetic world.

STRIDE (``--methods stride_ft``): the SFT(gold) program ``bench_compile.py --programs stride --methods sft`` saved
(``--warm-start DIR`` for another) is tuned further from its own runs, twice from the same start: with the SFT legs
alone (Supervisor, Extractor, Reasoner) and with the Meta-Planner's DPO on top. The claim: STRIDE-FT > its SFT legs
alone > prompt-only (the prompt-only and SFT rows are bench_compile's). The full STRIDE-FT row runs first; the legs
row then trains on exactly its SFT samples (the same N runs per question, the Meta-Planner's DPO pairs left out), so
the two rows differ by the DPO leg alone and not by sampling noise. Its training minutes add the full row's
collection minutes (the time of those runs and the selection), which it did not spend again.

REAP (``--methods multitask``): the same gold data and budget, trained once into one shared adapter for every role
(``MultiTaskSFT``) and once into one adapter per role (``SFT`` with ``adapter_groups={}``). The claim: multi-task
matches or beats per-role.

Each row: EM with a question-bootstrap 95% interval, F1, training minutes, prompt tokens per call, LM calls and
tokens per question, and for STRIDE-FT what each selection rule selected. Results go to
``benchmarks/results/bench_offline.json`` (rows for other programs and methods are kept).

Example:
    .venv/bin/python benchmarks/bench_offline.py --methods stride_ft --num-plans 4 --train-questions 100
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from bench_compile import RUNS, _earlier_rows, _key, _row, table

from _common import bench_parser, finished_training, trained_once, training_extra, write_results


def train_and_evaluate(
    load: Any,
    train: Any,
    test: list[Any],
    out: Path,
    name: str,
    method: str,
    threads: int,
    *,
    resume: bool,
    extra: Any = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Train (``train() -> (program, optimizer)``) or, with ``resume``, reuse a finished training saved under ``out``;
    evaluate the program on ``test`` (with ``resume``, a half-done evaluation goes on). Returns bench_compile's row
    plus the tokens (prompt and completion) per question the STRIDE paper reports, the optimizer's history, and what
    ``extra(optimizer)`` stored with the training."""
    import shutil

    from rolecall.evaluation import evaluate

    program, minutes, history = trained_once(out, load, train, reuse=resume, extra=extra)
    if not resume:
        shutil.rmtree(out / "eval", ignore_errors=True)
    result = evaluate(program, test, num_threads=threads, output_dir=out / "eval", resume=resume)
    row = _row(name, method, result.summary, minutes)
    row["tokens_per_question"] = round(result.summary.prompt_tokens + result.summary.completion_tokens, 1)
    return row, history, training_extra(out)


def main() -> None:
    parser = bench_parser(__doc__, "bench_offline")
    parser.add_argument("--methods", default="stride_ft,multitask", help="comma-separated: stride_ft, multitask")
    parser.add_argument("--test-questions", type=int, default=200, help="held-out test questions (default 200)")
    parser.add_argument("--train-questions", type=int, default=100, help="training questions (default 100)")
    parser.add_argument("--num-plans", type=int, default=4, help="STRIDE-FT plans per question (paper: 8)")
    parser.add_argument("--fact-selector", default="lm", choices=("lm", "answer"), help="STRIDE-FT's E* selector")
    parser.add_argument("--ft-minutes", type=float, default=10.0, help="each STRIDE-FT training budget (default 10)")
    parser.add_argument("--budget-minutes", type=float, default=15.0, help="each REAP SFT budget (default 15)")
    parser.add_argument("--epochs", type=float, default=20.0, help="REAP SFT passes (the budget stops it first)")
    parser.add_argument("--warm-start", type=Path, default=None, help="the SFT(gold) STRIDE program to tune")
    parser.add_argument("--threads", type=int, default=16, help="questions evaluated concurrently (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic world (default 0)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse each row's finished training and go on with a half-done evaluation")  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or set(methods) - {"stride_ft", "multitask"}:
        parser.error(f"--methods takes stride_ft and multitask; got {args.methods!r}")

    from rolecall.data.synthetic import synthetic_world
    from rolecall.errors import ConfigError
    from rolecall.lm import LocalLM
    from rolecall.optimizers import SFT, STRIDEFT
    from rolecall.optimizers.multitask_sft import MultiTaskSFT
    from rolecall.programs import REAP, STRIDE
    from rolecall.retrievers.bm25 import BM25
    from rolecall.utils.logs import quiet_repeated_warnings

    quiet_repeated_warnings()
    world = synthetic_world(seed=args.seed)
    test, train = world.test[: args.test_questions], world.train[: args.train_questions]
    retriever = BM25(world.corpus)
    runs = RUNS / "synthetic"
    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        row["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        rows[:] = [r for r in _earlier_rows(Path(args.out)) if _key(r) != _key(row)] + [row]
        print(table([row]), flush=True)
        out = write_results({"rows": rows, "table": table(rows)}, args)
        out.with_suffix(".md").write_text(table(rows))

    if "stride_ft" in methods:
        from rolecall.optimizers.core.samples import load_samples, save_samples
        from rolecall.optimizers.stride_ft.optimizer import _leg

        warm = args.warm_start or runs / "stride" / "sft" / "program"
        if not (warm / "program.json").is_file():
            raise SystemExit(f"no SFT(gold) STRIDE at {warm}: run bench_compile.py --programs stride --methods sft")
        full_out, collect_minutes = runs / "stride" / "stride_ft", None

        def load_stride(path: Path) -> Any:
            return STRIDE.load(path, retriever=retriever, lm=LocalLM())

        for method, legs in (("SFT + STRIDE-FT", None),
                             ("SFT + STRIDE-FT legs", ("supervisor", "extractor", "reasoner"))):  # fmt: skip
            out = runs / "stride" / ("stride_ft_legs" if legs else "stride_ft")
            kw: dict[str, Any] = {"legs": legs} if legs else {}
            shared = legs is not None and (full_out / "samples.jsonl").is_file()
            if shared and not (args.resume and finished_training(out)):  # the full row's runs, minus the DPO pairs
                kept = {a: [x for x in group if _leg(x) != "meta_planner"]
                        for a, group in load_samples(full_out / "samples.jsonl").items()}  # fmt: skip
                save_samples(out / "samples.jsonl", {a: group for a, group in kept.items() if group})
                kw["resume"] = True

            def train_ft(kw: dict[str, Any] = kw, out: Path = out) -> tuple[Any, Any]:
                program = STRIDE.load(warm, retriever=retriever, lm=LocalLM())
                optimizer = STRIDEFT(num_plans=args.num_plans, fact_selector=args.fact_selector,
                                     num_threads=args.threads, time_budget_minutes=args.ft_minutes,
                                     output_dir=str(out), seed=args.seed, **kw)  # fmt: skip
                program.compile(optimizer=optimizer, trainset=train)
                return program, optimizer

            try:
                row, history, extra = train_and_evaluate(
                    load_stride,
                    train_ft,
                    test,
                    out,
                    "stride",
                    method,
                    args.threads,
                    resume=args.resume,
                    extra=lambda optimizer: {"selection": optimizer.selection},
                )
            except ConfigError as err:  # e.g. no rule selected anything: say so, and go on with the next row
                print(f"{method}: no row ({err})", flush=True)
                continue
            row["selection"] = extra.get("selection", {})
            if legs is None:  # what the legs row reuses: the time of the runs and the selection
                loop_minutes = sum(r.get("time/step", 0.0) for r in history) / 60
                collect_minutes = max(0.0, row["train_minutes"] - loop_minutes)
                row["collect_minutes"] = round(collect_minutes, 2)
            elif shared:  # a resumed optimizer selects nothing itself: the full row's selection, its pairs left out
                selection = json.loads((full_out / "selection.json").read_text())
                row["selection"] = {**selection, "plan_pairs": 0, "meta_planner_samples": 0}
                row["samples_from"] = "SFT + STRIDE-FT"
                if collect_minutes is not None:
                    row["collect_minutes"] = round(collect_minutes, 2)
                    row["train_minutes"] = round(row["train_minutes"] + collect_minutes, 2)
            row["ft_steps"] = {s: max((r["step"] for r in history if r["stage"] == s), default=0)
                               for s in dict.fromkeys(r["stage"] for r in history)}  # fmt: skip
            record(row)
    if "multitask" in methods:
        for method in ("MultiTaskSFT(gold)", "SFT(gold), one adapter per role"):
            merged = method.startswith("MultiTask")
            groups: dict[str, Any] = {} if merged else {"adapter_groups": {}}
            out = runs / "reap" / ("multitask" if merged else "per_role")

            def train_sft(groups: dict[str, Any] = groups, out: Path = out, merged: bool = merged) -> tuple[Any, Any]:
                program = REAP(retriever, lm=LocalLM(), **groups)
                sft = SFT(epochs=args.epochs, time_budget_minutes=args.budget_minutes, num_threads=args.threads,
                          output_dir=str(out), seed=args.seed)  # fmt: skip
                if merged:
                    sft = MultiTaskSFT(dataclasses.replace(sft.sft_config, roles=tuple(program.roles)))
                program.compile(optimizer=sft, trainset=train)
                return program, sft

            row, _, extra = train_and_evaluate(
                lambda path: REAP.load(path, retriever=retriever, lm=LocalLM()),
                train_sft,
                test,
                out,
                "reap",
                method,
                args.threads,
                resume=args.resume,
                extra=lambda sft: {"sft_samples": {a: len(s) for a, s in sft.samples.items()}},
            )
            row["sft_samples"] = extra.get("sft_samples", {})
            record(row)
    print(table(rows))
    print(json.dumps({r["method"]: r.get("selection") for r in rows if r.get("selection")}, indent=1))


if __name__ == "__main__":
    main()
