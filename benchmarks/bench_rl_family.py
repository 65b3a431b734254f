"""Do the RL family's papers' claims hold, in direction, on the synthetic world? (issue 16, item 5)

Three claims, each on held-out synthetic test questions with the embedded SmolLM2-135M, every row trained and
evaluated in this process on 2 CPU cores:

- ``search_r1`` (Search-R1): GRPO on the agent (outcome EM minus a format penalty, retrieved text masked) beats the
  prompt-only agent. Rows: ``prompt-only``, ``GRPO`` (from the base, the papers' row), and as levers (pick with
  ``--search-r1-rows``) ``GRPO (graded format)`` (each malformed turn costs its share of the penalty), ``SFT(gold)``
  and ``SFT(gold) + GRPO`` (the cold start the other papers use).
- ``d2plan`` (D2Plan): SFT + SPlanRL beats SFT alone, and without R_p the Reasoner plans more sub-questions per question
  than with it. Rows: ``SFT(gold)`` (the cold start: D2Plan's gold path), ``SFT + SPlanRL`` and ``SFT + SPlanRL w/o
  R_p``, both from that SFT program.
- ``opd`` (MultiAgent-OPD): the OPD team beats the outcome-only team on EM, and its Searchers keep searching where the
  outcome-only Searchers' search count falls. Rows: ``SFT(gold) team`` (the warm start both start from), ``OPD`` and
  ``outcome-only``. The Teacher is the cascaded Searcher -> Answerer workflow, SFT(gold) on its shared adapter and then
  Stage I GRPO (``--teacher-minutes``); it is trained once and reused by both Stage II rows.

Every RL row is judged against its warm start question by question (won / lost, the paired bootstrap 95% interval of
the EM difference, McNemar's p), and each ablation row (w/o R_p, outcome-only) against its full method the same way
(the papers' direction: the full method better). Every row reports EM with a question-bootstrap 95% interval, F1,
training minutes, LM calls per question, prompt tokens per call, searches per question (retrieval steps) and, for
D2Plan, the sub-questions of the Reasoner's initial plan per question. RL rows also keep their per-step curve
(reward, searches or sub-questions) from the optimizer's history.

A row is written to the results JSON (and a markdown table beside it) as soon as it is done; a rerun skips rows already
there (``--fresh`` starts over), reuses a trained program saved under ``--runs`` and resumes a killed evaluation.

The acceptance runs (issue 56) fix each RL row's work, not its minutes: ``--rl-steps N`` (``--rl-minutes`` is then a
ceiling), the SFT warm starts' ``--max-steps``, the 500-question evaluation of ``--world-test 500 --test-questions
500``, ``--engine vllm`` for rollouts and evaluations. ``--rl-config FIELD=VALUE`` sets an option of every RL
optimizer of the run (``num_iterations=2``, ``lr_schedule=linear``, ``advantage_scale=none``); such a run takes its
own ``--tag`` and, with ``--warm-start-tag``, the warm starts of the run it is compared with.

Example:
    .venv/bin/python benchmarks/bench_rl_family.py --claims search_r1,d2plan,opd --test-questions 200
    .venv/bin/python benchmarks/bench_rl_family.py --claims d2plan --world-test 500 --test-questions 500 \
        --engine vllm --threads 24 --rl-steps 16 --rl-minutes 45 --rl-config num_iterations=2 --tag ppo2
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from _common import (
    bench_parser,
    paired_against,
    paired_cell,
    parse_fields,
    sft_optimizer,
    trained_once,
    write_results,
)

RUNS = Path(__file__).resolve().parent.parent / "runs" / "bench_rl_family"
CLAIMS = ("search_r1", "d2plan", "opd")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _trajectory_counts(records: list[Any]) -> dict[str, float]:
    """Searches (retrieval steps) and D2Plan's planned sub-questions per question, from the evaluation records."""
    from rolecall.optimizers.rewards.d2plan import generated_sub_questions
    from rolecall.programs.core.trajectory import Trajectory

    searches, planned = [], []
    for record in records:
        if record.trajectory is None:
            searches.append(0.0)
            continue
        trajectory = Trajectory.from_dict(record.trajectory)
        searches.append(float(len(trajectory.retrievals())))
        if any(s.kind == "role" and s.role == "reasoner_plan" for s in trajectory.steps):
            planned.append(float(generated_sub_questions(trajectory)))
    out = {"searches_per_question": round(_mean(searches), 3)}
    if planned:
        out["sub_questions_per_question"] = round(_mean(planned), 3)
    return out


def _row(claim: str, method: str, result: Any, train_minutes: float, eval_minutes: float) -> dict[str, Any]:
    summary = result.summary
    calls = summary.lm_calls or 1.0
    return {
        "claim": claim,
        "method": method,
        "n": summary.n,
        "em": summary.em,
        "em_ci": list(summary.em_ci),
        "f1": summary.f1,
        "train_minutes": round(train_minutes, 2),
        "eval_minutes": round(eval_minutes, 2),
        "lm_calls_per_question": round(summary.lm_calls, 2),
        "prompt_tokens_per_call": round(summary.prompt_tokens / calls, 1),
        "parse_rates": summary.parse_rates,
        **_trajectory_counts(result.records),
    }


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    """A row's identity: its claim, method and run tag ("" for an untagged run)."""
    return row["claim"], row["method"], row.get("tag", "")


def _curve(history: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, list[float]]:
    """Per-step values of ``keys`` (those the optimizer logged) from its history."""
    return {k: [round(float(r[k]), 3) for r in history if k in r] for k in keys if any(k in r for r in history)}


def _label(row: dict[str, Any]) -> str:
    return f"{row['method']} [{row['tag']}]" if row.get("tag") else row["method"]


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| claim | method | n | EM | EM 95% CI | F1 | train min | searches / q | sub-questions / q | LM calls / q "
        "| prompt tokens / call | vs warm start: ΔEM [paired 95% CI], won/lost, p | full method vs this ablation |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lo, hi = r["em_ci"]
        sub = r.get("sub_questions_per_question")
        lines.append(
            f"| {r['claim']} | {_label(r)} | {r['n']} | {r['em']:.3f} | {lo:.2f}–{hi:.2f} | {r['f1']:.3f} "
            f"| {r['train_minutes']:.1f} | {r['searches_per_question']:.2f} | {'' if sub is None else f'{sub:.2f}'} "
            f"| {r['lm_calls_per_question']:.1f} | {r['prompt_tokens_per_call']:.0f} "
            f"| {paired_cell(r.get('vs_warm_start'))} | {paired_cell(r.get('full_vs_ablation'))} |"
        )
    return "\n".join(lines) + "\n"


class Bench:
    """The shared state of one run: the data, the retriever, the results file and its rows."""

    def __init__(self, args: Any) -> None:
        from rolecall.data.synthetic import synthetic_world
        from rolecall.retrievers.bm25 import BM25

        self.args = args
        world = synthetic_world(seed=args.seed, n_test=args.world_test)
        self.train = list(world.train[: args.train_questions])
        self.test = list(world.test[: args.test_questions])
        self.retriever = BM25(world.corpus)
        self.out = Path(args.out)
        self.rows: list[dict[str, Any]] = self._earlier_rows()
        self.rl_fields: dict[str, Any] = parse_fields(args.rl_config, "--rl-config")
        self._lm: Any = None
        print(f"synthetic: {len(self.train)} train / {len(self.test)} test questions, {len(world.corpus)} passages")

    def _earlier_rows(self) -> list[dict[str, Any]]:
        if self.args.fresh:
            return []
        try:
            return list(json.loads(self.out.read_text(encoding="utf-8")).get("rows", []))
        except (OSError, ValueError, AttributeError):
            return []

    def folder(self, claim: str) -> Path:
        """Where ``claim``'s programs and records go: ``<runs>/<claim>``, or ``<runs>/<claim>-<tag>`` with ``--tag``."""
        return self.args.runs / (f"{claim}-{self.args.tag}" if self.args.tag else claim)

    def warm_folder(self, claim: str, name: str) -> Path:
        """The folder of ``claim``'s warm start ``name`` (``sft``, ``sft_team``, ``teacher``): this run's own, or with
        ``--warm-start-tag`` that run's (``""`` the untagged one), so a lever's rows start from the same trained
        program as the rows they are compared with instead of a second SFT training."""
        tag = self.args.warm_start_tag
        if tag is None:
            return self.folder(claim) / name
        return self.args.runs / (f"{claim}-{tag}" if tag else claim) / name

    def lm(self) -> Any:
        """A generation engine for the next program (``--engine``: LocalLM or vLLM); the previous one is stopped first,
        so at most one vLLM engine process runs at a time."""
        from rolecall.lm.engines import make_lm

        self.close()
        self._lm = make_lm(engine=self.args.engine)
        return self._lm

    def close(self) -> None:
        """Stop the last engine :meth:`lm` started."""
        from rolecall.lm.engines import close_lm

        if self._lm is not None:
            close_lm(self._lm)
            self._lm = None

    def rl_options(self, **defaults: Any) -> dict[str, Any]:
        """An RL optimizer's options: ``defaults``, its steps (``--rl-steps``, else unbounded so that ``--rl-minutes``
        ends the run) and minutes ceiling, then the ``--rl-config`` fields over them."""
        steps = self.args.rl_steps if self.args.rl_steps is not None else 10_000
        return {**defaults, "steps": steps, "time_budget_minutes": self.args.rl_minutes, **self.rl_fields}

    def done(self, claim: str, method: str) -> bool:
        return any(_key(r) == (claim, method, self.args.tag) for r in self.rows)

    def record(self, row: dict[str, Any]) -> None:
        """Add ``row`` (tagged with ``--tag``) and rewrite the results (a killed run keeps every finished row)."""
        if self.args.tag:
            row["tag"] = self.args.tag
        self.rows = [r for r in self.rows if _key(r) != _key(row)] + [row]
        order = {c: i for i, c in enumerate(CLAIMS)}
        self.rows.sort(key=lambda r: (order.get(r["claim"], len(order)), r.get("tag", "")))
        print(table([row]), flush=True)
        out = write_results({"rows": self.rows, "table": table(self.rows), "claims": claims(self.rows)}, self.args)
        out.with_suffix(".md").write_text(table(self.rows) + "\n" + "\n".join(claims(self.rows)) + "\n")

    def evaluate(self, program: Any, folder: Path) -> tuple[Any, float]:
        """Evaluate on the test questions into ``folder/eval`` (resuming its records); returns (result, minutes)."""
        from rolecall.evaluation import evaluate

        out = folder / "eval"
        started = time.perf_counter()
        result = evaluate(program, self.test, num_threads=self.args.threads, output_dir=out,
                          resume=(out / "records.jsonl").is_file())  # fmt: skip
        return result, (time.perf_counter() - started) / 60

    def trained(self, folder: Path, cls: Any, train: Any) -> tuple[Any, float, list[dict[str, Any]]]:
        """The program saved in ``folder/program``, or ``train()``'s (program, optimizer) saved there first
        (:func:`_common.trained_once`). Returns the program, its training minutes and the optimizer's history."""
        return trained_once(folder, lambda path: cls.load(path, retriever=self.retriever, lm=self.lm()), train)


# ---------------------------------------------------------------------------------------------- the three claims
SEARCH_R1_ROWS = ("GRPO", "GRPO (graded format)", "SFT(gold)", "SFT(gold) + GRPO")
"""Search-R1's trained rows: plain GRPO from the base (the papers' row), the same with the graded format penalty (each
malformed turn costs its share, so a base model that malforms nearly every turn still gets reward variance), the
SFT(gold) warm start alone, and GRPO from it (the cold start D2Plan and OPERA use, as a lever)."""


def run_search_r1(bench: Bench) -> None:
    """Prompt-only Search-R1 against Search-R1 trained with plain GRPO, from the base and from an SFT(gold) start."""
    from rolecall.optimizers import SearchR1GRPO
    from rolecall.programs.registry import build_program, get_program_class

    args, runs, cls = bench.args, bench.folder("search_r1"), get_program_class("search_r1")
    if not bench.done("search_r1", "prompt-only"):
        program = build_program("search_r1", bench.retriever, bench.lm())
        result, eval_minutes = bench.evaluate(program, runs / "prompt_only")
        bench.record(_row("search_r1", "prompt-only", result, 0.0, eval_minutes))
    wanted = args.search_r1_rows
    sft_folder, sft_minutes = bench.warm_folder("search_r1", "sft"), 0.0

    def train_sft() -> tuple[Any, Any]:
        program = build_program("search_r1", bench.retriever, bench.lm())
        optimizer = sft_optimizer(args, sft_folder / "train", show_progress=False)
        return program.compile(optimizer=optimizer, trainset=bench.train), optimizer

    if any(m.startswith("SFT") for m in wanted):
        sft_program, sft_minutes, _ = bench.trained(sft_folder, cls, train_sft)
        if "SFT(gold)" in wanted and not bench.done("search_r1", "SFT(gold)"):
            result, eval_minutes = bench.evaluate(sft_program, sft_folder)
            bench.record(_row("search_r1", "SFT(gold)", result, sft_minutes, eval_minutes))
    for method, name in (("GRPO", "grpo"), ("GRPO (graded format)", "grpo_graded"),
                         ("SFT(gold) + GRPO", "sft_grpo")):  # fmt: skip
        if method not in wanted or bench.done("search_r1", method):
            continue
        folder = runs / name

        def train(folder: Path = folder, method: str = method) -> tuple[Any, Any]:
            if method.startswith("SFT"):
                program = cls.load(sft_folder / "program", retriever=bench.retriever, lm=bench.lm())
            else:
                program = build_program("search_r1", bench.retriever, bench.lm())
            optimizer = SearchR1GRPO(**bench.rl_options(
                group_size=args.group_size, graded_format="graded" in method, num_threads=args.threads,
                output_dir=folder / "train", resume=(folder / "train").is_dir(), seed=args.seed, show_progress=False,
            ))  # fmt: skip
            return program.compile(optimizer=optimizer, trainset=bench.train), optimizer

        program, minutes, history = bench.trained(folder, cls, train)
        result, eval_minutes = bench.evaluate(program, folder)
        start = sft_minutes if method.startswith("SFT") else 0.0
        row = _row("search_r1", method, result, start + minutes, eval_minutes)
        row["rl_minutes"] = round(minutes, 2)
        row["steps"] = len(history)
        row["steps_planned"] = args.rl_steps
        row["optimizer_steps"] = sum(1 for r in history if r.get("groups/skipped", 0) < r.get("groups/total", 0))
        if method.startswith("SFT"):
            row["vs_warm_start"] = paired_against(sft_folder / "eval", folder / "eval")
        row["curve"] = _curve(
            history, ("reward/mean", "reward/std", "reward/answer", "reward/format", "search_r1/invalid_turns",
                      "search_r1/searches", "time/step")
        )  # fmt: skip
        bench.record(row)


def run_d2plan(bench: Bench) -> None:
    """SFT(gold) D2Plan, then SPlanRL from it with and without the plan reward R_p."""
    from rolecall.optimizers.splanrl import SPlanRL
    from rolecall.programs.registry import build_program, get_program_class

    args, runs, cls = bench.args, bench.folder("d2plan"), get_program_class("d2plan")
    sft_folder = bench.warm_folder("d2plan", "sft")

    def train_sft() -> tuple[Any, Any]:
        program = build_program("d2plan", bench.retriever, bench.lm())
        optimizer = sft_optimizer(args, sft_folder / "train", show_progress=False)
        return program.compile(optimizer=optimizer, trainset=bench.train), optimizer

    sft_program, sft_minutes, _ = bench.trained(sft_folder, cls, train_sft)
    if not bench.done("d2plan", "SFT(gold)"):
        result, eval_minutes = bench.evaluate(sft_program, sft_folder)
        bench.record(_row("d2plan", "SFT(gold)", result, sft_minutes, eval_minutes))
    for method, use_plan_reward, name in (("SFT + SPlanRL", True, "splanrl"),
                                          ("SFT + SPlanRL w/o R_p", False, "splanrl_no_rp")):  # fmt: skip
        if bench.done("d2plan", method):
            continue
        folder = runs / name

        def train(folder: Path = folder, use_plan_reward: bool = use_plan_reward) -> tuple[Any, Any]:
            program = cls.load(sft_folder / "program", retriever=bench.retriever, lm=bench.lm())
            optimizer = SPlanRL(**bench.rl_options(
                group_size=args.group_size, cold_start="none", num_threads=args.threads, seed=args.seed,
                output_dir=str(folder / "train"), show_progress=False,
            ), use_plan_reward=use_plan_reward)  # fmt: skip
            return program.compile(optimizer=optimizer, trainset=bench.train), optimizer

        program, minutes, history = bench.trained(folder, cls, train)
        result, eval_minutes = bench.evaluate(program, folder)
        row = _row("d2plan", method, result, sft_minutes + minutes, eval_minutes)
        row["vs_warm_start"] = paired_against(sft_folder / "eval", folder / "eval")
        if not use_plan_reward:  # the paper's direction: SPlanRL beats its w/o R_p ablation
            row["full_vs_ablation"] = paired_against(folder / "eval", runs / "splanrl" / "eval")
        row["rl_minutes"] = round(minutes, 2)
        row["steps"] = len(history)
        row["steps_planned"] = args.rl_steps
        row["curve"] = _curve(
            history, ("reward/mean", "reward/answer", "reward/plan", "plan/sub_questions", "parse/rate", "time/step")
        )
        bench.record(row)


def run_opd(bench: Bench) -> None:
    """The SFT(gold) team, then OPD and the outcome-only ablation from it, one Teacher for both."""
    from rolecall.optimizers.opd import OPD, OPDConfig
    from rolecall.optimizers.opd_teacher import OPDTeacher, load_teacher
    from rolecall.programs.registry import build_program, get_program_class

    args, runs = bench.args, bench.folder("opd")
    team_cls, cascade_cls = get_program_class("hierarchical_team"), get_program_class("cascaded_team")
    sft_folder, teacher_folder = bench.warm_folder("opd", "sft_team"), bench.warm_folder("opd", "teacher")

    def train_sft() -> tuple[Any, Any]:
        program = build_program("hierarchical_team", bench.retriever, bench.lm(), parameter_sharing="shared")
        optimizer = sft_optimizer(args, sft_folder / "train", show_progress=False)
        return program.compile(optimizer=optimizer, trainset=bench.train), optimizer

    def train_teacher() -> tuple[Any, Any]:
        cascade = build_program("cascaded_team", bench.retriever, bench.lm(), parameter_sharing="shared")
        sft = sft_optimizer(args, teacher_folder / "sft", show_progress=False)
        grpo = OPDTeacher(OPDConfig(group_size=args.group_size, teacher_steps=args.teacher_steps or 10_000,
                                    teacher_minutes=args.teacher_minutes, num_threads=args.threads, seed=args.seed,
                                    output_dir=str(teacher_folder), show_progress=False))  # fmt: skip
        cascade = cascade.compile(optimizer=sft, trainset=bench.train)
        return cascade.compile(optimizer=grpo, trainset=bench.train), grpo

    sft_program, sft_minutes, _ = bench.trained(sft_folder, team_cls, train_sft)
    if not bench.done("opd", "SFT(gold) team"):
        result, eval_minutes = bench.evaluate(sft_program, sft_folder)
        bench.record(_row("opd", "SFT(gold) team", result, sft_minutes, eval_minutes))
    _, teacher_minutes, teacher_history = bench.trained(teacher_folder, cascade_cls, train_teacher)
    for method, outcome_only, name in (("OPD", False, "opd"), ("outcome-only", True, "outcome_only")):
        if bench.done("opd", method):
            continue
        folder = runs / name

        def train(folder: Path = folder, outcome_only: bool = outcome_only) -> tuple[Any, Any]:
            lm = bench.lm()
            load_teacher(lm, teacher_folder / "program")  # first: the team's own adapter may share its name
            team = team_cls.load(sft_folder / "program", retriever=bench.retriever, lm=lm)
            optimizer = OPD(**bench.rl_options(
                group_size=args.group_size, train_teacher=False, num_threads=args.threads, seed=args.seed,
                output_dir=str(folder / "train"), show_progress=False,
            ), outcome_only=outcome_only)  # fmt: skip
            return team.compile(optimizer=optimizer, trainset=bench.train), optimizer

        program, minutes, history = bench.trained(folder, team_cls, train)
        result, eval_minutes = bench.evaluate(program, folder)
        row = _row("opd", method, result, sft_minutes + teacher_minutes + minutes, eval_minutes)
        row["vs_warm_start"] = paired_against(sft_folder / "eval", folder / "eval")
        if outcome_only:  # the paper's direction: OPD beats the outcome-only ablation
            row["full_vs_ablation"] = paired_against(folder / "eval", runs / "opd" / "eval")
        row["rl_minutes"] = round(minutes, 2)
        row["teacher_minutes"] = round(teacher_minutes, 2)
        row["teacher_curve"] = _curve(teacher_history, ("reward/outcome", "team/searches"))
        row["steps"] = len(history)
        row["steps_planned"] = args.rl_steps
        row["curve"] = _curve(history, ("reward/outcome", "reward/leader", "team/tool_steps", "team/searches",
                                        "kl/teacher", "time/step"))  # fmt: skip
        bench.record(row)


# ---------------------------------------------------------------------------------------------- verdicts
def claims(rows: list[dict[str, Any]]) -> list[str]:
    """Each claim's verdict from the rows there are (a claim whose rows are missing is left out), once per run tag:
    a tagged run's rows are compared with each other, never with another run's."""
    out: list[str] = []
    for tag in dict.fromkeys(r.get("tag", "") for r in rows):
        lines = _claims([r for r in rows if r.get("tag", "") == tag])
        out += [f"{line} [{tag}]" for line in lines] if tag else lines
    return out


def _claims(rows: list[dict[str, Any]]) -> list[str]:
    by = {(r["claim"], r["method"]): r for r in rows}
    out: list[str] = []

    def em(key: tuple[str, str]) -> str:
        r = by[key]
        return f"{r['em']:.3f} [{r['em_ci'][0]:.2f}, {r['em_ci'][1]:.2f}]"

    def verdict(ok: bool) -> str:
        return "holds" if ok else "does NOT hold"

    for method in (m for m in SEARCH_R1_ROWS if "GRPO" in m):
        if {("search_r1", "prompt-only"), ("search_r1", method)} <= by.keys():
            a, b = by["search_r1", method], by["search_r1", "prompt-only"]
            out.append(f"- Search-R1 {method} beats prompt-only: {verdict(a['em'] > b['em'])} "
                       f"(EM {em(('search_r1', method))} vs {em(('search_r1', 'prompt-only'))})")  # fmt: skip
    if {("d2plan", "SFT(gold)"), ("d2plan", "SFT + SPlanRL")} <= by.keys():
        a, b = by["d2plan", "SFT + SPlanRL"], by["d2plan", "SFT(gold)"]
        out.append(f"- D2Plan: SFT + SPlanRL beats SFT: {verdict(a['em'] > b['em'])} "
                   f"(EM {em(('d2plan', 'SFT + SPlanRL'))} vs {em(('d2plan', 'SFT(gold)'))})")  # fmt: skip
    if {("d2plan", "SFT + SPlanRL"), ("d2plan", "SFT + SPlanRL w/o R_p")} <= by.keys():
        a, b = by["d2plan", "SFT + SPlanRL w/o R_p"], by["d2plan", "SFT + SPlanRL"]
        sa, sb = a.get("sub_questions_per_question", 0.0), b.get("sub_questions_per_question", 0.0)
        out.append(f"- D2Plan: w/o R_p plans more sub-questions: {verdict(sa > sb)} ({sa:.2f} vs {sb:.2f} per "
                   f"question)")  # fmt: skip
    if {("opd", "OPD"), ("opd", "outcome-only")} <= by.keys():
        a, b = by["opd", "OPD"], by["opd", "outcome-only"]
        out.append(f"- OPD beats outcome-only on EM: {verdict(a['em'] > b['em'])} "
                   f"(EM {em(('opd', 'OPD'))} vs {em(('opd', 'outcome-only'))})")  # fmt: skip
        if ("opd", "SFT(gold) team") in by:
            s0 = by["opd", "SFT(gold) team"]["searches_per_question"]
            sa, sb = a["searches_per_question"], b["searches_per_question"]
            out.append(f"- OPD Searchers keep searching, outcome-only's search count falls: "
                       f"{verdict(sa >= sb and sb < s0)} (searches per question: start {s0:.2f}, OPD {sa:.2f}, "
                       f"outcome-only {sb:.2f})")  # fmt: skip
    return out


def main() -> None:
    from rolecall.lm.engines import add_engine_argument

    parser = bench_parser(__doc__, "bench_rl_family")
    parser.add_argument("--claims", default=",".join(CLAIMS), help=f"comma-separated, from {', '.join(CLAIMS)}")
    parser.add_argument("--test-questions", type=int, default=200, help="held-out test questions (default 200)")
    parser.add_argument("--train-questions", type=int, default=400, help="training questions (default 400)")
    parser.add_argument("--sft-minutes", type=float, default=20.0, help="each SFT(gold) warm start (default 20)")
    parser.add_argument("--epochs", type=float, default=2.0, help="SFT passes over each adapter's samples")
    parser.add_argument("--max-steps", default=None,
                        help="each SFT(gold) warm start's optimizer steps per adapter, ADAPTER=N,... or N (default: "
                        "--epochs, with --sft-minutes a ceiling)")  # fmt: skip
    parser.add_argument("--rl-steps", type=int, default=None,
                        help="each RL row's optimizer steps (the acceptance runs fix these; default: as many as "
                        "--rl-minutes allows)")  # fmt: skip
    parser.add_argument("--rl-minutes", type=float, default=12.0,
                        help="each RL row's wall-clock budget (with --rl-steps a ceiling)")  # fmt: skip
    parser.add_argument("--rl-config", action="append", default=[], metavar="FIELD=VALUE",
                        help="an option of every RL optimizer this run builds (SPlanRLConfig, OPDConfig, "
                        "SearchR1GRPOConfig fields, e.g. advantage_scale=none, questions_per_step=8); repeatable. "
                        "Give such a run its own --tag")  # fmt: skip
    parser.add_argument("--warm-start-tag", default=None, metavar="TAG",
                        help="start the RL rows from the warm starts (SFT program, OPD Teacher) trained by the run "
                        "tagged TAG ('' for the untagged one) instead of training this run's own")  # fmt: skip
    parser.add_argument(
        "--search-r1-rows",
        default=",".join(SEARCH_R1_ROWS),
        help=f"Search-R1's trained rows, comma-separated from: {', '.join(SEARCH_R1_ROWS)}",
    )
    parser.add_argument("--teacher-minutes", type=float, default=8.0, help="OPD Stage I GRPO budget (after SFT)")
    parser.add_argument("--teacher-steps", type=int, default=None,
                        help="OPD Stage I GRPO steps (default: as many as --teacher-minutes allows)")  # fmt: skip
    parser.add_argument("--group-size", type=int, default=5, help="rollouts per question G (papers: 5)")
    parser.add_argument("--threads", type=int, default=16, help="questions run concurrently (default 16)")
    add_engine_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic world and the optimizers")
    parser.add_argument("--world-test", type=int, default=300,
                        help="size of the synthetic world's test split (default 300; 500 for the paired acceptance "
                        "runs, which also changes the train split, so one results file keeps one value)")  # fmt: skip
    parser.add_argument("--runs", type=Path, default=RUNS, help="where programs and evaluation records are written")
    parser.add_argument(
        "--tag",
        default="",
        help="label this run's rows (shown as 'method [TAG]', compared only with each other) and folders "
        "(<runs>/<claim>-TAG), so a rerun with other settings (e.g. a longer --rl-minutes) keeps the earlier rows",
    )
    parser.add_argument("--fresh", action="store_true", help="start the results file empty")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    rows = [m.strip() for m in args.search_r1_rows.split(",") if m.strip()]
    if set(rows) - set(SEARCH_R1_ROWS):
        parser.error(f"--search-r1-rows takes {', '.join(SEARCH_R1_ROWS)}; got {args.search_r1_rows!r}")
    args.search_r1_rows = rows
    chosen = [c.strip() for c in args.claims.split(",") if c.strip()]
    if set(chosen) - set(CLAIMS) or not chosen:
        parser.error(f"--claims takes {', '.join(CLAIMS)}; got {args.claims!r}")

    from rolecall.errors import ConfigError
    from rolecall.utils.logs import quiet_repeated_warnings

    quiet_repeated_warnings()
    bench = Bench(args)
    runners = {"search_r1": run_search_r1, "d2plan": run_d2plan, "opd": run_opd}
    try:
        for claim in chosen:
            print(f"== {claim}", flush=True)
            runners[claim](bench)
    except ConfigError as err:
        raise SystemExit(f"bench_rl_family: {err}") from None
    finally:
        bench.close()
    print(table(bench.rows))
    print("\n".join(claims(bench.rows)))


if __name__ == "__main__":
    main()
