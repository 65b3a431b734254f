"""Does compiling make a program better? Prompt-only, BootstrapFewShot and SFT(gold), in one process.

For each program (default: OPERA; every program in ``rolecall.optimizers.sft.GOLD_BUILDERS`` has gold-path targets)
on the embedded SmolLM2-135M:

1. prompt-only: the program with its built-in few-shot demos, evaluated on held-out test questions;
2. BootstrapFewShot (``--methods bfs``): DSPy's demo bootstrapping on the training questions, then evaluated. The
   teacher that produces the traces is the untrained program itself (``--bfs-teacher self``, DSPy's default; it
   walks the training questions one at a time until ``--bfs-demos`` of them are answered exactly, so a program that
   is right 1-3% of the time reads a hundred or more) or the program the SFT row saved (``--bfs-teacher sft``: the
   trained roles' traces become demos for the untrained model, which keeps its long demo prompts; the row's minutes
   are the bootstrapping's, the teacher's SFT minutes are ``teacher_train_minutes``);
3. SFT(gold): the same program compiled with ``rolecall.optimizers.SFT`` on training questions (each adapter trained
   on its own demo-free prompts along the gold path, within a wall-clock budget), evaluated on the same questions.
   ``--roles`` trains only some roles (the row is "SFT(gold) [roles=...]"; the others keep their demos): on HotpotQA,
   which has answers and supporting facts but no decomposition, OPERA's only gold role is synthesis;
4. OPERA's RL ladder on top of that SFT warm start (``--methods mapgrpo,grpo``): ``SFT + MAPGRPO`` (progressive,
   expert-augmented groups, c_best without gradient unless ``--expert-gradient``: then the row is "SFT + MAPGRPO +
   off-policy guidance") and ``SFT + GRPO`` (``JointGRPO``: all roles at once, no expert), each within
   ``--rl-minutes``. The warm start is the program the SFT row saved (``<runs>/<dataset>/<program>/sft/program``;
   ``--warm-start DIR`` for another); the row records its per-step cost and per-phase timing, and the reward curves
   go to ``<runs>/.../<method>/rewards.png``;
5. the compute-matched SFT row (``--methods sft_matched``): the SFT warm start trained further with SFT(gold) for the
   RL rung's minutes, as a number of steps (each adapter's SFT steps times RL minutes / SFT minutes).

Reported per row: EM with a question-bootstrap 95% interval, F1, training minutes, prompt tokens per LM call and LM
calls per question (demo-free prompts are the point of training), and each role's parse rate. Every row trained on top
of a warm start is judged against it question by question (``rolecall.evaluation.compare``): won / lost / tied, the
paired bootstrap 95% interval of the EM difference and McNemar's exact p. The RL acceptance runs use
``--world-test 500 --test-questions 500`` (500 held-out questions of the seed-0 world) and ``--sft-seed 1`` for a
second SFT row (SFT's own run-to-run spread); ``--engine`` picks LocalLM or vLLM (auto: vLLM where it fits).
Results go to ``benchmarks/results/bench_compile.json`` and a markdown table beside it; the compiled program is
saved under ``--runs``. A row already in that file for another (dataset, program, method) is kept, so the table can
be filled one program at a time (``--fresh`` starts it empty); each row records the settings it ran with.

Examples:
    .venv/bin/python benchmarks/bench_compile.py --test-questions 50 --train-questions 200 --budget-minutes 12
    .venv/bin/python benchmarks/bench_compile.py --dataset musique --programs opera,single_step_rag --epochs 6
    .venv/bin/python benchmarks/bench_compile.py --dataset hotpotqa --programs opera --roles synthesis --epochs 6
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from rolecall.lm.engines import add_engine_argument

from _common import (
    bench_parser,
    fields_label,
    finished_training,
    paired_against,
    paired_cell,
    parse_fields,
    sft_optimizer,
    trained_once,
    with_fields,
    write_results,
)

RUNS = Path(__file__).resolve().parent.parent / "runs" / "bench_compile"


def _row(name: str, method: str, summary: Any, train_minutes: float, dataset: str = "synthetic") -> dict[str, Any]:
    calls = summary.lm_calls or 1.0
    return {
        "dataset": dataset,
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


def _row_settings(args: Any, method: str) -> dict[str, Any]:
    """The arguments one row of ``method`` depends on, stored with the row (the file's ``config`` is the last run's)."""
    keys = ["test_questions", "train_questions", "world_test", "engine", "threads", "seed", "option"]
    if method.startswith("BootstrapFewShot"):
        keys += ["bfs_demos", "bfs_teacher", "bfs_train"]
    if method.startswith("SFT(gold)"):
        keys += ["budget_minutes", "epochs", "max_steps", "learning_rate", "lr_schedule", "batch_size", "grad_accum",
                 "roles", "sft_seed"]  # fmt: skip
    if method.startswith("SFT + "):
        keys += ["rl_minutes", "rl_steps", "group_size", "inputs_per_step", "expert_gradient", "warm_start",
                 "rl_config"]  # fmt: skip
    return {k: getattr(args, k) for k in keys}


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    return row.get("dataset", "synthetic"), row["program"], row["method"]


def _earlier_rows(out: Path) -> list[dict[str, Any]]:
    """The rows already in ``out`` (none when it is missing or unreadable)."""
    try:
        return list(json.loads(out.read_text(encoding="utf-8")).get("rows", []))
    except (OSError, ValueError, AttributeError):
        return []


def _resumable(output_dir: Path, resume: bool) -> bool:
    """Whether ``evaluate`` resumes ``output_dir``: ``resume`` and records there; else stale records are cleared."""
    has_records = (output_dir / "records.jsonl").exists()
    if not resume and has_records:
        shutil.rmtree(output_dir)
    return resume and has_records


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| dataset | program | method | n | EM | EM 95% CI | F1 | train min | prompt tokens / call "
        "| LM calls / question | vs warm start: its EM, won / lost | ΔEM [paired 95% CI], won/lost, McNemar p |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        low, high = r["em_ci"]
        versus = r.get("vs_warm_start")
        against = f"{versus['warm_start_em']:.3f}, {versus['won']} / {versus['lost']}" if versus else ""
        paired = paired_cell(versus)  # rows written before the paired comparison have won / lost only
        lines.append(
            f"| {r.get('dataset', 'synthetic')} | {r['program']} | {r['method']} | {r['n']} | {r['em']:.3f} "
            f"| {low:.2f}–{high:.2f} | {r['f1']:.3f} | "
            f"{r['train_minutes']:.1f} | {r['prompt_tokens_per_call']:.0f} | {r['lm_calls_per_question']:.1f} "
            f"| {against} | {paired} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:

    parser = bench_parser(__doc__, "bench_compile")
    parser.add_argument("--programs", default="opera", help="comma-separated registry names (default: opera)")
    parser.add_argument(
        "--dataset",
        default="synthetic",
        choices=("synthetic", "hotpotqa", "2wiki", "musique"),
        help="synthetic world (its train/test splits), or a real dev subset in ../shared/data split 80/20 by a hash "
        "of the question id",
    )
    parser.add_argument(
        "--methods",
        default="prompt,sft",
        help="comma-separated, from prompt, bfs, sft, mapgrpo, grpo, sft_matched (the compute-matched SFT row)",
    )
    parser.add_argument("--test-questions", type=int, default=200, help="held-out test questions (default 200)")
    parser.add_argument("--train-questions", type=int, default=400, help="training questions (default 400)")
    parser.add_argument("--budget-minutes", type=float, default=15.0, help="SFT wall-clock budget (default 15)")
    parser.add_argument("--epochs", type=float, default=2.0, help="SFT passes over each adapter's samples")
    parser.add_argument("--max-steps", default=None, help="SFT step cap: N, or adapter=N,adapter=N")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="SFT AdamW learning rate (default 2e-3)")
    parser.add_argument(
        "--lr-schedule",
        default="linear",
        choices=("constant", "linear"),
        help="SFT learning-rate schedule (default: linear)",
    )
    parser.add_argument("--batch-size", type=int, default=2, help="SFT samples per forward pass (default 2)")
    parser.add_argument("--grad-accum", type=int, default=1, help="SFT micro-batches per optimizer step (default 1)")
    parser.add_argument("--roles", default=None, metavar="ROLE[,ROLE]",
                        help="SFT: train only these roles' adapters; the others keep their demos (default: "
                        "every role with a target; on HotpotQA, OPERA's only gold role: synthesis)")  # fmt: skip
    parser.add_argument("--bfs-demos", type=int, default=3, help="BootstrapFewShot bootstrapped demos per role")
    parser.add_argument(
        "--bfs-teacher",
        default="self",
        choices=("self", "sft"),
        help="BootstrapFewShot's teacher: the untrained program (self, DSPy's default) or the SFT row's saved program "
        "(sft; run --methods sft first)",
    )
    parser.add_argument(
        "--bfs-train",
        type=int,
        default=None,
        help="training questions BootstrapFewShot may read (default: all --train-questions; it stops at --bfs-demos "
        "answered exactly)",
    )
    parser.add_argument("--rl-minutes", type=float, default=20.0, help="MAPGRPO / GRPO wall-clock budget (default 20)")
    parser.add_argument("--rl-steps", default="plan=6,analysis=8,rewrite=2", help="RL steps per stage (role=N,...)")
    parser.add_argument("--group-size", type=int, default=4, help="RL group size G, c_best included (default 4)")
    parser.add_argument("--inputs-per-step", type=int, default=4, help="RL groups per optimizer step (default 4)")
    parser.add_argument("--expert-gradient", action="store_true", help="MAPGRPO: c_best gets a gradient too")
    parser.add_argument(
        "--rl-config",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an MAPGRPOConfig field for both RL rows, a JSON value (e.g. temperature=1.3, learning_rate.plan=4e-4, "
        "loss_type=dapo); the rows are labelled with it, so each setting is a row of its own",
    )
    parser.add_argument("--warm-start", type=Path, default=None, help="the SFT program RL starts from")
    parser.add_argument(
        "--matched-minutes",
        type=float,
        default=None,
        help="sft_matched: the RL minutes to match (default: the train minutes of this table's 'SFT + MAPGRPO' row)",
    )
    parser.add_argument("--threads", type=int, default=16, help="questions evaluated concurrently (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic world (default 0)")
    parser.add_argument(
        "--world-test",
        type=int,
        default=300,
        help="size of the synthetic world's test split (default 300); a larger one (500 for the paired RL rows) also "
        "changes which questions the train split gets, so every row of one table must use the same value",
    )
    parser.add_argument(
        "--sft-seed",
        type=int,
        default=0,
        help="seed of the SFT row's training (sample order, LoRA init); a seed other than 0 is a row of its own, "
        "'SFT(gold) [seed=N]' in <runs>/<program>/sft-seedN, which measures SFT's run-to-run spread (default 0)",
    )
    add_engine_argument(parser)
    parser.add_argument("--runs", type=Path, default=RUNS, help="where evaluation records and programs are written")
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a program option for every row (e.g. -o top_k=3), checked as `rolecall eval -o` checks it",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the prompt-only, BootstrapFewShot and SFT evaluations from their records.jsonl (questions "
        "already answered are kept); SFT and the RL rows reuse the program a finished training saved (<runs>/<program>/"
        "<row>/train.json beside it) instead of training again, and resume its evaluation",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start the results file empty (default: keep its rows for other datasets, programs and methods)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if set(methods) - {"prompt", "bfs", "sft", "mapgrpo", "grpo", "sft_matched"}:
        parser.error(f"--methods takes prompt, bfs, sft, mapgrpo, grpo and sft_matched; got {args.methods!r}")

    from rolecall.data.synthetic import synthetic_world
    from rolecall.evaluation import evaluate
    from rolecall.lm.engines import make_lm
    from rolecall.programs.registry import build_program, get_program_class, parse_program_options
    from rolecall.retrievers.bm25 import BM25
    from rolecall.utils.logs import quiet_repeated_warnings

    quiet_repeated_warnings()
    if args.dataset == "synthetic":
        world = synthetic_world(seed=args.seed, n_test=args.world_test)
        test, train, corpus = world.test[: args.test_questions], world.train[: args.train_questions], world.corpus
    else:
        from rolecall.cli_common import DEFAULT_DATA_PATHS
        from rolecall.data import hash_split
        from rolecall.data.corpus import build_corpus, load_dataset

        path = DEFAULT_DATA_PATHS[args.dataset]
        if not path.is_file():
            parser.error(f"{args.dataset}: {path} is missing (the real dev subsets live in ../shared/data)")
        train, test = hash_split(load_dataset(args.dataset, path), fraction=0.8)
        test, train, corpus = (
            test[: args.test_questions],
            train[: args.train_questions],
            build_corpus(args.dataset, path),
        )
    print(f"{args.dataset}: {len(train)} train / {len(test)} test questions, {len(corpus)} passages", flush=True)
    retriever = BM25(corpus)
    args.runs = args.runs / args.dataset
    if args.fresh:
        Path(args.out).unlink(missing_ok=True)
    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        row["settings"] = _row_settings(args, row["method"])
        # re-read the file: another run may have written rows since this one started
        rows[:] = [r for r in _earlier_rows(Path(args.out)) if _key(r) != _key(row)] + [row]
        print(table([row]), flush=True)
        out = write_results({"rows": rows, "table": table(rows)}, args)  # after every row: a killed run keeps its rows
        out.with_suffix(".md").write_text(table(rows))

    for name in [p.strip() for p in args.programs.split(",") if p.strip()]:
        options = parse_program_options(name, args.option)
        lm = make_lm(engine=args.engine) if {"prompt", "sft"} & set(methods) else None  # a fresh base per program
        if "prompt" in methods:
            program = build_program(name, retriever, lm, **options)
            before = evaluate(program, test, num_threads=args.threads, output_dir=args.runs / name / "prompt_only",
                              resume=_resumable(args.runs / name / "prompt_only", args.resume))  # fmt: skip
            record(_row(name, "prompt-only", before.summary, 0.0, args.dataset))
        if "sft" in methods:
            folder = args.runs / name / ("sft" if args.sft_seed == 0 else f"sft-seed{args.sft_seed}")
            reuse = args.resume and finished_training(folder)

            def train_sft(
                name: str = name, folder: Path = folder, options: dict[str, Any] = options, lm: Any = lm
            ) -> tuple[Any, Any]:
                sft = sft_optimizer(args, folder)
                return build_program(name, retriever, lm, **options).compile(optimizer=sft, trainset=train), sft

            load = functools.partial(get_program_class(name).load, retriever=retriever, lm=lm)
            program, minutes, history = trained_once(folder, load, train_sft, reuse=reuse)
            if reuse:
                print(f"{name}: SFT(gold) reused from {folder} ({minutes:.1f} min of training)", flush=True)
            eval_dir = folder.parent / f"{folder.name}_eval"
            after = evaluate(program, test, num_threads=args.threads, output_dir=eval_dir,
                             resume=_resumable(eval_dir, reuse))  # fmt: skip  # a new training: old records go
            label = f"SFT(gold) [roles={args.roles}]" if args.roles else "SFT(gold)"  # the others keep their demos
            if args.sft_seed:
                label += f" [seed={args.sft_seed}]"
            row = _row(name, label, after.summary, minutes, args.dataset)
            row["sft_steps"] = {r["adapter"]: r["step"] for r in history}
            row["sft_step_seconds"] = {
                a: round(sum(r["time/step"] for r in history if r["adapter"] == a) / n, 1)
                for a, n in row["sft_steps"].items()
            }
            record(row)
        if "bfs" in methods:
            record(_bfs_row(args, name, options, retriever, train, test))
        for method in [m for m in ("mapgrpo", "grpo") if m in methods]:
            record(_rl_row(args, name, method, retriever, test))
        if "sft_matched" in methods:
            record(_sft_matched_row(args, name, retriever, train, test))
    print(table(rows))


def _bfs_row(
    args: Any, name: str, options: dict[str, Any], retriever: Any, train: list[Any], test: list[Any]
) -> dict[str, Any]:
    """DSPy's BootstrapFewShot on the untrained program, its teacher the program itself or the saved SFT program."""
    import dspy

    from rolecall.evaluation import evaluate
    from rolecall.evaluation.metrics import answer_exact_match
    from rolecall.lm import LocalLM
    from rolecall.programs.registry import build_program, get_program_class

    teacher, teacher_minutes = None, None
    if args.bfs_teacher == "sft":
        folder = args.runs / name / "sft"

        def no_teacher() -> tuple[Any, Any]:
            raise SystemExit(f"--bfs-teacher sft: no finished SFT training in {folder}; run --methods sft first")

        load = functools.partial(get_program_class(name).load, retriever=retriever, lm=LocalLM())
        teacher, teacher_minutes, _ = trained_once(folder, load, no_teacher)
    bfs = dspy.teleprompt.BootstrapFewShot(
        metric=answer_exact_match, max_bootstrapped_demos=args.bfs_demos, max_labeled_demos=0, max_rounds=1
    )
    bootstrap_on = train[: args.bfs_train] if args.bfs_train else train
    started = time.perf_counter()
    student = build_program(name, retriever, LocalLM(), **options)  # a fresh base: no trained adapter leaks in
    extra = {"teacher": teacher} if teacher is not None else {}
    program = student.compile(optimizer=bfs, trainset=[e.to_dspy() for e in bootstrap_on], **extra)
    minutes = (time.perf_counter() - started) / 60
    demos = {role: len(module.demos) for role, module in program.roles.items()}
    print(f"{name}: BootstrapFewShot ({args.bfs_teacher} teacher) in {minutes:.1f} min, demos per role {demos}",
          flush=True)  # fmt: skip
    method = "BootstrapFewShot" if teacher is None else "BootstrapFewShot (teacher: SFT(gold))"
    folder = args.runs / name / ("bfs_eval" if teacher is None else "bfs_sft_teacher_eval")
    result = evaluate(program, test, num_threads=args.threads, output_dir=folder,
                      resume=_resumable(folder, args.resume))  # fmt: skip
    row = _row(name, method, result.summary, minutes, args.dataset)
    row["bfs_demos_per_role"] = demos
    if teacher_minutes is not None:  # the teacher's own SFT, not counted in the row's minutes of bootstrapping
        row["teacher_train_minutes"] = round(teacher_minutes, 2)
    return row


def _rl_row(args: Any, name: str, method: str, retriever: Any, test: list[Any]) -> dict[str, Any]:
    """One rung of the RL ladder: the saved SFT program, trained further with MAPGRPO or JointGRPO, evaluated."""
    from rolecall.data.synthetic import synthetic_world
    from rolecall.evaluation import evaluate
    from rolecall.lm.engines import make_lm
    from rolecall.optimizers import MAPGRPO, JointGRPO, MAPGRPOConfig
    from rolecall.optimizers.sft import parse_max_steps
    from rolecall.programs.registry import get_program_class

    warm = Path(args.warm_start) if args.warm_start else args.runs / name / "sft" / "program"
    if not (warm / "program.json").is_file():
        raise SystemExit(f"{method}: no SFT program at {warm}; run --methods sft first or pass --warm-start DIR")
    args.warm_start = str(warm)  # recorded in the row's settings (a later rung reads it back as a path)
    steps = parse_max_steps(args.rl_steps)
    if not isinstance(steps, dict):
        raise SystemExit(f"--rl-steps takes role=N,role=N; got {args.rl_steps!r}")
    fields = parse_fields(args.rl_config, "--rl-config")
    levers, slug = fields_label(fields)
    guided = args.expert_gradient and method == "mapgrpo"
    stem = f"{method}-offpolicy" if guided else method  # never the plain row's folder: its program and records stay
    out = args.runs / name / (f"{stem}-{slug}" if slug else stem)
    reuse = args.resume and finished_training(out)
    if not reuse:
        shutil.rmtree(out, ignore_errors=True)  # a new training: the old program, records and curves go
    config = MAPGRPOConfig(stages=tuple(steps), steps=steps, group_size=args.group_size,
                           inputs_per_step=args.inputs_per_step, time_budget_minutes=args.rl_minutes,
                           expert_gradient=guided, num_threads=args.threads,
                           output_dir=out, seed=args.seed)  # fmt: skip
    config = with_fields(config, fields, "--rl-config")
    train = synthetic_world(seed=args.seed, n_test=args.world_test).train if args.dataset == "synthetic" else None
    if train is None:
        raise SystemExit("the RL ladder runs on the synthetic world (its rewards need gold decompositions)")

    def load(path: Path) -> Any:  # each program on a fresh base: the warm start, or a finished rung's
        return get_program_class(name).load(path, retriever=retriever, lm=make_lm(engine=args.engine))

    def train_rl() -> tuple[Any, Any]:
        optimizer = MAPGRPO(config) if method == "mapgrpo" else JointGRPO(config)
        return load(warm).compile(optimizer=optimizer, trainset=train[: args.train_questions]), optimizer

    program, minutes, history = trained_once(out, load, train_rl, reuse=reuse)
    if reuse:
        print(f"{name}: {method} reused from {out} ({minutes:.1f} min of training)", flush=True)
    result = evaluate(program, test, num_threads=args.threads, output_dir=out / "eval",
                      resume=_resumable(out / "eval", reuse))  # fmt: skip
    label = "SFT + MAPGRPO" if method == "mapgrpo" else "SFT + GRPO"
    if config.expert_gradient:
        label += " + off-policy guidance"
    if levers:
        label += f" [{levers}]"
    row = _row(name, label, result.summary, minutes, args.dataset)
    phases = ("collect", "generate", "execute", "score", "update", "step")
    row["rl_steps"] = {s: sum(r["stage"] == s for r in history) for s in steps}
    row["rl_step_seconds"] = {s: round(sum(r["time/step"] for r in history if r["stage"] == s)
                                       / max(1, row["rl_steps"][s]), 1) for s in steps}  # fmt: skip
    row["rl_phase_seconds"] = {p: round(sum(r[f"time/{p}"] for r in history) / max(1, len(history)), 1) for p in phases}
    row["rl_reward_mean"] = {
        s: [round(r.get("reward/mean", 0.0), 3) for r in history if r["stage"] == s] for s in steps
    }
    row["rl_groups_skipped"] = sum(r.get("groups/skipped", 0.0) for r in history)
    plan_rows = [r for r in history if r["stage"] == "plan"]
    if plan_rows:  # cumulative counts: distinct plans executed, plans and sub-goals reused
        row["rl_plan_execution"] = {k.split("/", 1)[1]: v for k, v in plan_rows[-1].items() if k.startswith("plan/")}
    versus = _against_warm_start(warm, out / "eval")
    if versus is not None:
        row["vs_warm_start"] = versus
    _plot_rewards(history, out / "rewards.png", label)
    return row


def _sft_matched_row(args: Any, name: str, retriever: Any, train: list[Any], test: list[Any]) -> dict[str, Any]:
    """The compute-matched SFT row: the SFT warm start trained further with SFT(gold) for as long as the RL rung took.

    The extra work is a number of steps, not a clock: each adapter gets its SFT row's steps times
    ``rl_seconds / sft_seconds``, where ``sft_seconds`` prices the SFT row's steps at the idle machine's step costs
    (:data:`rolecall.demo_steps.SFT_STEP_SECONDS`, else the row's own measured ones), so SFT + extra SFT costs what
    SFT + RL cost on an idle machine and the result does not depend on how busy the machine was. Judged against the
    same warm start by the paired comparison, like the RL rungs.
    """
    from rolecall.demo_steps import SFT_STEP_SECONDS
    from rolecall.evaluation import evaluate
    from rolecall.lm.engines import make_lm
    from rolecall.programs.registry import get_program_class

    rows = {r["method"]: r for r in _earlier_rows(Path(args.out)) if r.get("program") == name}
    sft_row, rl_row = rows.get("SFT(gold)"), rows.get("SFT + MAPGRPO")
    if sft_row is None or "sft_steps" not in sft_row:
        raise SystemExit("sft_matched: no 'SFT(gold)' row with its steps in --out; run --methods sft first")
    rl_minutes = args.matched_minutes if args.matched_minutes is not None else (rl_row or {}).get("train_minutes")
    if rl_minutes is None:
        raise SystemExit("sft_matched: no 'SFT + MAPGRPO' row in --out; run it first or pass --matched-minutes")
    measured = sft_row.get("sft_step_seconds") or {}
    sft_seconds = sum(n * SFT_STEP_SECONDS.get(a, measured.get(a, 2.0)) for a, n in sft_row["sft_steps"].items())
    ratio = 60 * float(rl_minutes) / max(1e-9, sft_seconds)
    extra = {a: max(1, round(n * ratio)) for a, n in sft_row["sft_steps"].items()}
    warm = Path(args.warm_start) if args.warm_start else args.runs / name / "sft" / "program"
    folder = args.runs / name / "sft_matched"
    reuse = args.resume and finished_training(folder)
    if not reuse:
        shutil.rmtree(folder, ignore_errors=True)
    args.max_steps = ",".join(f"{a}={n}" for a, n in extra.items())
    args.epochs, args.budget_minutes = 1000.0, max(60.0, 3 * float(rl_minutes))  # the steps bind; minutes a ceiling

    def load(path: Path) -> Any:
        return get_program_class(name).load(path, retriever=retriever, lm=make_lm(engine=args.engine))

    def train_more() -> tuple[Any, Any]:
        sft = sft_optimizer(args, folder)
        return load(warm).compile(optimizer=sft, trainset=train), sft

    program, minutes, history = trained_once(folder, load, train_more, reuse=reuse)
    result = evaluate(program, test, num_threads=args.threads, output_dir=folder / "eval",
                      resume=_resumable(folder / "eval", reuse))  # fmt: skip
    row = _row(name, f"SFT(gold) compute-matched (+{rl_minutes:.0f} min of SFT)", result.summary,
               float(sft_row["train_minutes"]) + minutes, args.dataset)  # fmt: skip
    row["sft_steps"] = {a: sum(r.get("adapter") == a for r in history) for a in extra}
    row["matched_rl_minutes"] = round(float(rl_minutes), 2)
    versus = _against_warm_start(warm, folder / "eval")
    if versus is not None:
        row["vs_warm_start"] = versus
    return row


def _against_warm_start(warm: Path, eval_dir: Path) -> dict[str, Any] | None:
    """The paired comparison (:func:`_common.paired_against`) of this rung's evaluation against its warm start's.

    The warm start's records are, for a rung warm-started from another rung, that rung's ``eval`` beside its
    ``program``; else the SFT row's (``<program>/sft_eval`` beside ``<program>/sft/program``). None when neither
    exists or the two evaluations hold different questions.
    """
    for candidate in (warm.parent / "eval", warm.parent.parent / f"{warm.parent.name}_eval"):
        if (candidate / "records.jsonl").is_file():
            return paired_against(candidate, eval_dir)
    return None


def _plot_rewards(history: list[dict[str, Any]], path: Path, title: str) -> None:
    """Mean group reward per step, one panel per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(dict.fromkeys(r["stage"] for r in history))
    if not stages:
        return
    fig, axes = plt.subplots(1, len(stages), figsize=(4 * len(stages), 3), squeeze=False)
    for ax, stage in zip(axes[0], stages, strict=True):
        rows = [r for r in history if r["stage"] == stage]
        ax.plot([r["step"] for r in rows], [r.get("reward/mean", 0.0) for r in rows], marker="o", label="policy")
        ax.plot([r["step"] for r in rows], [r.get("reward/expert", 0.0) for r in rows], ls="--", label="c_best")
        ax.set_title(stage)
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
