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

Each STRIDE-FT row is judged against its warm start (the SFT(gold) row's evaluation, ``<runs>/stride/sft_eval``) by the
paired comparison, and the legs row against the full row (under the table; positive: DPO on top helps, the paper's
direction). ``--world-test 500 --test-questions 500`` evaluates on bench_compile's 500 held-out questions, where that
script's SFT(gold) STRIDE row was trained and evaluated with the same flags; ``--engine`` picks LocalLM or vLLM.

Levers: ``--ft-config FIELD=VALUE`` sets a ``STRIDEFTConfig`` field (``dpo_learning_rate=5e-4``, ``epochs=4``,
``pairs_per_question=3``); such rows carry the fields in their name and folder, and train on the default row's
samples unless a field changes the collection. ``--resume`` reuses finished trainings and half-done evaluations.

Example:
    .venv/bin/python benchmarks/bench_offline.py --methods stride_ft --num-plans 4 --train-questions 100
    .venv/bin/python benchmarks/bench_offline.py --methods stride_ft --stride-rows full --ft-config epochs=4
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_compile import RUNS, _against_warm_start, _earlier_rows, _key, _row, table

from _common import (
    bench_parser,
    fields_label,
    finished_training,
    paired_against,
    paired_cell,
    parse_fields,
    trained_once,
    training_extra,
    with_fields,
    write_results,
)


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


COLLECTION_FIELDS = frozenset(
    {"num_plans", "plan_temperature", "f1_gap", "max_plan_f1", "pairs_per_question", "fact_selector", "exact_ratio"}
)
"""STRIDEFTConfig fields that change which runs are collected and what is selected from them; a ``--ft-config`` of
other fields (learning rates, epochs, beta) trains on the samples the default row selected."""


def stride_rows(
    args: Any, warm: Path, retriever: Any, train: list[Any], test: list[Any], runs: Path
) -> Iterator[dict[str, Any]]:
    """The STRIDE-FT rows, each yielded as soon as it is evaluated (so it is recorded before the next one trains): the
    full row (DPO on top) and the legs row on exactly its SFT samples.

    With ``--ft-config`` the rows are labelled with the fields and kept in folders of their own; when no field changes
    the collection, the full row trains on the default row's samples (``runs/stride_ft``) instead of running the
    program again, and its collection minutes are that row's.
    """
    from rolecall.errors import ConfigError
    from rolecall.lm.engines import make_lm
    from rolecall.optimizers import STRIDEFT, STRIDEFTConfig
    from rolecall.optimizers.core.samples import load_samples, save_samples
    from rolecall.optimizers.stride_ft.optimizer import _leg
    from rolecall.programs import STRIDE

    fields = parse_fields(args.ft_config, "--ft-config")
    levers, slug = fields_label(fields)
    slug = f"-{slug}" if slug else ""
    base_out, full_out = runs / "stride_ft", runs / f"stride_ft{slug}"
    reuse_base = bool(levers) and not COLLECTION_FIELDS & set(fields) and (base_out / "samples.jsonl").is_file()
    runs_from = args.runs_from.resolve() if args.runs_from else None

    def load_stride(path: Path) -> Any:
        return STRIDE.load(path, retriever=retriever, lm=make_lm(engine=args.engine))

    wanted = {r.strip() for r in args.stride_rows.split(",") if r.strip()}
    for kind, legs in (("full", None), ("legs", ("supervisor", "extractor", "reasoner"))):
        if kind not in wanted:
            continue
        method = ("SFT + STRIDE-FT" if legs is None else "SFT + STRIDE-FT legs") + (f" [{levers}]" if levers else "")
        out = full_out if legs is None else runs / f"stride_ft_legs{slug}"
        source = base_out if (legs is None and reuse_base) else full_out  # whose runs the row's samples come from
        kw: dict[str, Any] = {"legs": legs} if legs else {}
        if runs_from is not None and not reuse_base:
            kw["runs_from"] = str(runs_from)
        shared = source != out and (source / "samples.jsonl").is_file()
        if shared and not (args.resume and finished_training(out)):
            kept = {a: [x for x in group if legs is None or _leg(x) != "meta_planner"]
                    for a, group in load_samples(source / "samples.jsonl").items()}  # fmt: skip
            save_samples(out / "samples.jsonl", {a: group for a, group in kept.items() if group})
            kw["resume"] = True  # the optimizer trains on these samples and collects nothing

        config = with_fields(
            STRIDEFTConfig(num_plans=args.num_plans, fact_selector=args.fact_selector, num_threads=args.threads,
                           time_budget_minutes=args.ft_minutes, output_dir=str(out), seed=args.seed, **kw),
            fields, "--ft-config",
        )  # fmt: skip

        def train_ft(config: STRIDEFTConfig = config) -> tuple[Any, Any]:
            program, optimizer = load_stride(warm), STRIDEFT(config)
            program.compile(optimizer=optimizer, trainset=train)
            return program, optimizer

        try:
            row, history, extra = train_and_evaluate(
                load_stride, train_ft, test, out, "stride", method, args.threads, resume=args.resume,
                extra=lambda optimizer: {"selection": optimizer.selection},
            )  # fmt: skip
        except ConfigError as err:  # e.g. no rule selected anything: say so, and go on with the next row
            print(f"{method}: no row ({err})", flush=True)
            continue
        if shared:  # the optimizer selected nothing itself: the source row's selection, less what it left out
            selection, collect = _collection(source)
            if legs is not None:
                selection.update(plan_pairs=0, meta_planner_samples=0)
            row["samples_from"] = str(source.relative_to(runs.parent))
            row["train_minutes"] = round(row["train_minutes"] + collect, 2)
        else:
            selection, collect = extra.get("selection", {}), _collect_minutes(out)
            if "runs_from" in kw:  # the reused runs cost their own row's collection minutes
                reused = _collection(runs_from)[1]
                row["runs_from"] = (
                    str(runs_from.relative_to(runs.parent)) if runs_from.is_relative_to(runs.parent) else str(runs_from)
                )
                row["train_minutes"] = round(row["train_minutes"] + reused, 2)
                collect += reused
        row["selection"], row["collect_minutes"] = selection, round(collect, 2)
        (out / "collection.json").write_text(json.dumps({"selection": selection, "collect_minutes": collect}) + "\n")
        row["ft_steps"] = {s: max((r["step"] for r in history if r["stage"] == s), default=0)
                           for s in dict.fromkeys(r["stage"] for r in history)}  # fmt: skip
        versus = _against_warm_start(warm, out / "eval")
        if versus is not None:
            row["vs_warm_start"] = versus
        if legs is not None and (full_out / "eval" / "records.jsonl").is_file():  # the paper's direction: full > legs
            row["full_vs_ablation"] = paired_against(out / "eval", full_out / "eval")
        yield row


def ablation_lines(rows: list[dict[str, Any]]) -> str:
    """Under the table: each STRIDE-FT legs row's paired comparison with its full row (positive: the full method,
    DPO on top, is better, the paper's direction)."""
    lines = [f"- {r['method']} -> its full row: {paired_cell(r['full_vs_ablation'])}"
             for r in rows if r.get("full_vs_ablation")]  # fmt: skip
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def _collection(folder: Path) -> tuple[dict[str, Any], float]:
    """What a STRIDE-FT row in ``folder`` selected and the minutes its collection took (its ``collection.json``, or
    for a row written before that file, its ``selection.json`` and ``train.json``)."""
    try:
        info = json.loads((folder / "collection.json").read_text(encoding="utf-8"))
        return dict(info["selection"]), float(info["collect_minutes"])
    except (OSError, ValueError, KeyError):
        return json.loads((folder / "selection.json").read_text(encoding="utf-8")), _collect_minutes(folder)


def _collect_minutes(folder: Path) -> float:
    """Minutes a STRIDE-FT training in ``folder`` spent outside its optimizer steps: running and selecting."""
    info = json.loads((folder / "train.json").read_text(encoding="utf-8"))
    return max(0.0, info["minutes"] - sum(r.get("time/step", 0.0) for r in info["history"]) / 60)


def main() -> None:
    from rolecall.lm.engines import add_engine_argument

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
    parser.add_argument("--world-test", type=int, default=300,
                        help="size of the synthetic world's test split (default 300; 500 for the paired acceptance "
                        "runs, as bench_compile's, whose SFT(gold) rows these start from)")  # fmt: skip
    add_engine_argument(parser)
    parser.add_argument("--ft-config", action="append", default=[], metavar="FIELD=VALUE",
                        help="a STRIDEFTConfig field, a JSON value (e.g. dpo_learning_rate=5e-4, epochs=4): rows of "
                        "their own; without collection fields they train on the default row's samples")  # fmt: skip
    parser.add_argument("--runs", type=Path, default=RUNS / "synthetic", help="where programs and records go")
    parser.add_argument("--runs-from", type=Path, default=None, metavar="DIR",
                        help="a STRIDE-FT row's folder whose runs.jsonl the rows select from (run only what it "
                        "lacks), for --ft-config selection fields tried on one collection")  # fmt: skip
    parser.add_argument("--stride-rows", default="full,legs", help="STRIDE-FT rows: full, legs (default both)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse each row's finished training and go on with a half-done evaluation")  # fmt: skip
    args = parser.parse_args()
    if args.runs_from is not None:
        from rolecall.optimizers.stride_ft.optimizer import RUNS_FILE

        if not (args.runs_from / RUNS_FILE).is_file():
            parser.error(f"--runs-from {args.runs_from}: no {RUNS_FILE} there; give the folder of a STRIDE-FT row")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or set(methods) - {"stride_ft", "multitask"}:
        parser.error(f"--methods takes stride_ft and multitask; got {args.methods!r}")

    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm import LocalLM
    from rolecall.optimizers import SFT
    from rolecall.optimizers.multitask_sft import MultiTaskSFT
    from rolecall.programs import REAP
    from rolecall.retrievers.bm25 import BM25
    from rolecall.utils.logs import quiet_repeated_warnings

    quiet_repeated_warnings()
    world = synthetic_world(seed=args.seed, n_test=args.world_test)
    test, train = world.test[: args.test_questions], world.train[: args.train_questions]
    retriever = BM25(world.corpus)
    runs = args.runs
    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        row["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        rows[:] = [r for r in _earlier_rows(Path(args.out)) if _key(r) != _key(row)] + [row]
        print(table([row]), flush=True)
        out = write_results({"rows": rows, "table": table(rows)}, args)
        out.with_suffix(".md").write_text(table(rows) + ablation_lines(rows))

    if "stride_ft" in methods:
        warm = args.warm_start or runs / "stride" / "sft" / "program"
        if not (warm / "program.json").is_file():
            raise SystemExit(f"no SFT(gold) STRIDE at {warm}: run bench_compile.py --programs stride --methods sft")
        for row in stride_rows(args, warm, retriever, train, test, runs / "stride"):
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
