"""STRIDE-FT: STRIDE improves from its own executed trajectories, no teacher (``seeds/stride.txt`` Sec. 3.3).

    for q in trainset, N times:   run STRIDE with its plan calls sampled at temperature T (N diverse plans
                                  P_q^(i), each executed through the pipeline; scored: correct, F1, iterations,
                                  failures)
    D_plan  = {(P+, P-)}          clearly better and distinct (selection.preference_pairs)
    D_sup   = causal rewrites of correct runs
    D_ext   = (z_i, D_z) -> E*_i, the minimal facts a frozen copy selects from E_i, |E_i| > 1, correct runs
    D_reas  = verbose final answers retargeted to gold + 2x already-exact ones
    Meta-Planner: DPO (sigmoid) on D_plan against itself before DPO (log pi_ref stored once, before training)
    Supervisor, Extractor, Reasoner: SFT (completion-only NLL) on their sets

Each leg is a stage on the training core (one adapter each; the Meta-Planner's two calls share one). Collection happens
before any update, so the "frozen copy" selecting minimal facts is the Extractor's model as it was at collection.
Samples are built on the prompts the trained roles will see (demo-free), saved to ``samples.jsonl`` and reused by
``resume``; what each rule selected goes to ``selection.json`` and :attr:`STRIDEFT.selection`. Collection is most of
the cost (N program runs per question), so each scored run is appended to ``runs.jsonl`` as it finishes: a collection
killed half-way resumes with the runs it has (``resume=True`` runs only the missing ones), and the same runs can be
selected from again with other selection settings (:attr:`STRIDEFTConfig.runs_from`) without running anything.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dspy
from tqdm.auto import tqdm

from rolecall.data.types import Example
from rolecall.errors import ConfigError
from rolecall.evaluation.records import RecordWriter, to_jsonable
from rolecall.optimizers.core.base import RunConfig, WeightOptimizer
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.logprobs import store_reference_logps
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.samples import load_samples, samples_from_trajectory, save_samples
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.sft import trainable_examples
from rolecall.optimizers.stride_ft.selection import (
    LengthBalance,
    Outcome,
    Run,
    answer_bearing_facts,
    causal_rewrites,
    concise_answer_targets,
    minimal_fact_targets,
    plan_call_pairs,
    plan_text,
    preference_pairs,
    rewritten_facts,
    score_run,
)
from rolecall.programs.core.gold import format_pair
from rolecall.programs.core.options import option
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.stride.parse import parse_facts
from rolecall.programs.stride.program import STRIDE
from rolecall.signatures.stride import SelectFacts

__all__ = ["STRIDEFT", "STRIDEFTConfig", "LEGS", "RUNS_FILE", "load_runs"]

logger = logging.getLogger(__name__)

LEGS: tuple[str, ...] = ("meta_planner", "supervisor", "extractor", "reasoner")
"""The modules STRIDE-FT tunes, each with its selection rule and loss (DPO for the Meta-Planner, SFT otherwise)."""

RUNS_FILE = "runs.jsonl"
"""The collection journal in ``output_dir``: one scored run per line, appended as each run finishes."""


@dataclass(kw_only=True)
class STRIDEFTConfig(RunConfig):
    """Settings of :class:`STRIDEFT`; defaults are the paper's (Sec. 4.1) unless noted; the loop settings
    (``num_threads``, ``time_budget_minutes``, ``seed``, ``output_dir`` with ``samples.jsonl`` and ``selection.json``,
    ``resume``, ``show_progress``) are :class:`RunConfig`'s."""

    legs: tuple[str, ...] = LEGS
    """The modules to tune; drop ``meta_planner`` for "the SFT legs alone"."""
    num_plans: int = option(8, low=2)
    """N, plans sampled and executed per training question."""
    plan_temperature: float = option(1.0, low=0.0, high=2.0)
    """Sampling temperature of the two plan calls (the downstream roles keep their own setting)."""
    f1_gap: float = option(0.3, low=0.0, high=1.0)
    """A winner without a correct-vs-incorrect margin must beat the loser's F1 by more than this."""
    max_plan_f1: float = option(0.8, low=0.0, high=1.0)
    """The two plans of a pair must have a token F1 below this (sufficiently distinct)."""
    pairs_per_question: int = option(1, low=1)
    """Preference pairs kept per question (the paper reports 371 pairs from 15,000 questions: few per question)."""
    fact_selector: str = "lm"
    """``lm``: the frozen Extractor model picks E* with the paper's prompt (:class:`SelectFacts`); ``answer``: the
    facts that contain the sub-question's answer (a rule, for models too small to follow the selection prompt)."""
    exact_ratio: float = option(2.0, low=0.0)
    """Reasoner: already-exact samples per verbose one."""
    epochs: float = option(2.0, low=0.01)
    """Passes over each leg's samples."""
    batch_size: int = option(16, low=1)
    """Samples per optimizer step (``micro_batch_size`` per pass, gradients accumulated)."""
    micro_batch_size: int = option(4, low=1)
    """Samples per forward/backward pass (a DPO sample is two sequences)."""
    dpo_learning_rate: float = option(3e-5, low=1e-8, high=1.0)
    """AdamW learning rate of the Meta-Planner's DPO."""
    sft_learning_rate: float = option(1e-4, low=1e-8, high=1.0)
    """AdamW learning rate of the SFT legs."""
    beta: float = option(0.1, low=1e-6)
    """DPO's beta."""
    balance_pair_length: bool = True
    """Not the paper's: draw the preference pairs so that the chosen plan is not systematically the shorter one
    (:class:`~rolecall.optimizers.stride_ft.selection.LengthBalance`: while more pairs so far have the shorter plan
    chosen, a question's winner is paired with a loser whose plan is not longer, where one qualifies). The pairs'
    lengths are reported in :attr:`STRIDEFT.selection` (``plan_pair_length``) either way; False is the paper's rule
    (the worst-ranked clearly worse run), under which DPO learned to prefer shorter plans."""
    dpo_length_normalize: bool = False
    """Not the paper's: DPO on per-token mean log-probs (a lever against pairs whose chosen plan is mostly the
    shorter one; use with a larger ``beta``)."""
    demo_free: bool = True
    """Train on (and afterwards run) the tuned roles' prompts without demos."""
    collect_minutes: float | None = option(None, low=1e-6)
    """Not the paper's: wall-clock minutes of the collection (``time_budget_minutes`` bounds the training steps
    only; None: no limit). No run starts after it; runs go round by round (every question's first plan, then every
    second) so a cut collection leaves each question as many runs as the others, give or take one. The runs it did
    not start are counted in :attr:`STRIDEFT.selection` (``runs_not_started``) and run by a resumed collection."""
    runs_from: str | None = None
    """A ``runs.jsonl`` (or the folder holding one) of an earlier collection on the same training questions and
    program: its runs are selected from instead of running the program again (the runs it lacks are still run). For
    selection settings (``f1_gap``, ``max_plan_f1``, ``pairs_per_question``, ``fact_selector``, ``exact_ratio``,
    ``legs``) tried on one collection; not for ``num_plans`` above the journal's or another ``plan_temperature``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = sorted(set(self.legs) - set(LEGS))
        if unknown or not self.legs:
            raise ConfigError(f"STRIDEFT legs must be a non-empty subset of {list(LEGS)}; got {list(self.legs)}")
        if self.fact_selector not in ("lm", "answer"):
            raise ConfigError(f"fact_selector must be 'lm' or 'answer'; got {self.fact_selector!r}")
        if self.batch_size % self.micro_batch_size:
            raise ConfigError(
                f"batch_size={self.batch_size} must be a multiple of micro_batch_size={self.micro_batch_size}"
            )


class STRIDEFT(WeightOptimizer[list[TrainingSample], list[TrainingSample], list[TrainingSample]]):
    """STRIDE-FT: Meta-Planner DPO and Supervisor / Extractor / Reasoner SFT from STRIDE's own runs (see module).

    Args:
        config: the settings; keyword arguments build one instead (``STRIDEFT(num_plans=4)``).

    Attributes:
        selection: what each rule selected: runs, correct runs, DPO pairs, and samples per leg.

    Example:
        >>> program = STRIDE(retriever, lm=LocalLM())                                        # doctest: +SKIP
        >>> program.compile(optimizer=[SFT(), STRIDEFT(num_plans=4)], trainset=world.train)  # doctest: +SKIP
    """

    def __init__(self, config: STRIDEFTConfig | None = None, **kw: Any) -> None:
        self.ft_config = STRIDEFTConfig.merged(config, kw)
        cfg = self.ft_config
        super().__init__(cfg.loop_config("interleaved"))
        self.samples: dict[str, list[TrainingSample]] = {}
        """Adapter -> its samples (the layout of ``samples.jsonl``)."""
        self.pools: dict[str, list[TrainingSample]] = {}
        """Leg -> the samples its stage trains on (a leg's share of its adapter's samples)."""
        self.selection: dict[str, Any] = {}

    def trainer_config(self, leg: str) -> TrainerConfig:
        """DPO (sigmoid, stored reference) for the Meta-Planner, completion-only NLL for the other legs."""
        cfg = self.ft_config
        return TrainerConfig(
            loss="dpo" if leg == "meta_planner" else "nll",
            learning_rate=cfg.dpo_learning_rate if leg == "meta_planner" else cfg.sft_learning_rate,
            beta=cfg.beta,
            dpo_length_normalize=cfg.dpo_length_normalize,
            micro_batch_size=cfg.micro_batch_size,
            gradient_accumulation_steps=cfg.batch_size // cfg.micro_batch_size,
        )

    # ------------------------------------------------------------------ the weight-optimizer contract
    def stages(self, student: Any, trainset: Sequence[Any]) -> list[Stage]:
        """Collect and select (or reload on resume), then one stage per leg that has samples.

        Raises:
            ConfigError: the program is not STRIDE on a ``LocalLM``, the trainset holds no rolecall ``Example``,
                or no rule selected anything.
        """
        cfg = self.ft_config
        if not isinstance(student, STRIDE):
            raise ConfigError(f"STRIDEFT applies to the stride program; got {type(student).__name__}")
        examples = trainable_examples("STRIDEFT", student, trainset, "with gold answers")
        path = Path(cfg.output_dir) / "samples.jsonl" if cfg.output_dir else None
        self.samples = load_samples(path) if cfg.resume and path is not None else {}
        if self.samples:
            self._mark_trained(student, self.samples)
            logger.info("STRIDEFT: resumed with the samples in %s", path)
        else:
            self.samples = self._collect(student, examples)
            if path is not None:
                save_samples(path, self.samples)
                (path.parent / "selection.json").write_text(json.dumps(self.selection, indent=1))
        if not self.samples:
            raise ConfigError(
                f"STRIDEFT selected no sample from {len(examples)} questions x {cfg.num_plans} runs "
                f"({self.selection}); use more questions, a warm-started program (SFT first), or more plans"
            )
        stages = []
        self.pools = {}
        for leg in LEGS:
            adapter = _leg_adapter(student, leg)
            samples = [s for s in self.samples.get(adapter, []) if _leg(s) == leg] if adapter else []
            if not samples:
                continue
            self.pools[leg] = samples
            trainer = self.trainer_config(leg)
            steps = max(1, round(cfg.epochs * len(samples) / trainer.samples_per_step))
            stages.append(Stage(name=leg, adapter=adapter, steps=steps, trainer=trainer, roles=(leg,)))
        return stages

    def collect(self, ctx: StepContext) -> list[TrainingSample]:
        """The next batch of the leg's samples (reshuffled each epoch)."""
        return ctx.take(self.pools[ctx.stage.name], ctx.stage.trainer.samples_per_step)

    def compile(self, student: Any, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **kw: Any) -> Any:
        """Tune ``student``'s STRIDE modules in place from its own runs on ``trainset`` and return it."""
        super().compile(student, trainset=trainset, valset=valset, **kw)
        if self.ft_config.output_dir is not None:
            (Path(self.ft_config.output_dir) / "stride_ft_config.json").write_text(
                json.dumps(asdict(self.ft_config), indent=2)
            )
        return student

    # ------------------------------------------------------------------ collection and selection
    def _collect(self, program: STRIDE, examples: list[Example]) -> dict[str, list[TrainingSample]]:
        cfg = self.ft_config
        runs = self._run_all(program, examples)
        flat = [r for group in runs for r in group]
        legs = set(cfg.legs) & set(program.roles)
        chosen: dict[str, list[tuple[Step, dict[str, Any] | None]]] = {leg: [] for leg in LEGS}
        pairs: list[tuple[Step, Step]] = []
        if "meta_planner" in cfg.legs:
            balance = LengthBalance()
            for group in runs:
                avoid = cfg.balance_pair_length and balance.avoid_shorter_chosen
                for w, lose in preference_pairs(group, f1_gap=cfg.f1_gap, max_plan_f1=cfg.max_plan_f1,
                                                per_question=cfg.pairs_per_question,
                                                avoid_shorter_chosen=avoid):  # fmt: skip
                    pairs += plan_call_pairs(group[w].trajectory, group[lose].trajectory)
                    balance.add(len(plan_text(group[w].trajectory).split()),
                                len(plan_text(group[lose].trajectory).split()))  # fmt: skip
            self.selection["plan_pair_length"] = balance.report()
            logger.info("STRIDEFT plan pairs by length (words): %s", balance.report())
        if "supervisor" in legs:
            chosen["supervisor"] = [(s, None) for s in causal_rewrites(flat)]
        if "extractor" in legs:
            targets = self._minimal_facts(program, flat)
            chosen["extractor"] = [(s, {**s.outputs, "facts": rewritten_facts(s, kept)}) for s, kept in targets]
        if "reasoner" in legs:
            verbose, exact = concise_answer_targets(flat, exact_ratio=cfg.exact_ratio, rng=random.Random(cfg.seed))
            retargeted = [(s, {**s.outputs, "answer": gold}) for s, gold in verbose]
            chosen["reasoner"] = retargeted + [(s, None) for s in exact]
            self.selection["reasoner_verbose"], self.selection["reasoner_exact"] = len(verbose), len(exact)
        self.selection.update(
            questions=len(examples),
            runs=len(flat),
            correct_runs=sum(r.outcome.correct for r in flat),
            plan_pairs=len(pairs),
            **{f"{leg}_samples": len(chosen[leg]) for leg in ("supervisor", "extractor", "reasoner")},
        )
        out: dict[str, list[TrainingSample]] = {}
        tuned = {_leg_adapter(program, leg) for leg in LEGS if chosen[leg]}
        if pairs:
            tuned.add(_leg_adapter(program, "meta_planner"))
        self._mark_trained(program, tuned)  # the samples are built on the prompts the tuned roles will see
        for leg in LEGS:
            for step, outputs in chosen[leg]:
                sample = self._sample(program, step, outputs)
                out.setdefault(sample.adapter, []).append(sample)
        dpo = []
        for good, bad in pairs:
            chosen_sample, rejected = self._sample(program, good), self._sample(program, bad)
            dpo.append(TrainingSample(role="meta_planner", adapter=chosen_sample.adapter,
                                      prompt_ids=chosen_sample.prompt_ids, completion_ids=chosen_sample.completion_ids,
                                      loss_mask=chosen_sample.loss_mask, rejected_ids=rejected.completion_ids,
                                      rejected_loss_mask=rejected.loss_mask))  # fmt: skip
        if dpo:  # pi_ref: the Meta-Planner before DPO, scored once
            backend = program.lm.backend
            backend.ensure_adapter(dpo[0].adapter)
            store_reference_logps(backend, dpo, adapter=dpo[0].adapter, batch_size=cfg.micro_batch_size)
            out.setdefault(dpo[0].adapter, []).extend(dpo)
        self.selection["meta_planner_samples"] = len(dpo)
        logger.info("STRIDEFT selection: %s", self.selection)
        return out

    def _run_all(self, program: STRIDE, examples: list[Example]) -> list[list[Run]]:
        """N runs per question with the plan calls sampled, each executed through the pipeline and scored.

        Runs already in the journal (``runs_from``, or ``output_dir``'s own ``runs.jsonl`` on ``resume``) are reused;
        each new run is appended to ``output_dir/runs.jsonl`` the moment it is scored.
        """
        cfg = self.ft_config
        journal = Path(cfg.output_dir) / RUNS_FILE if cfg.output_dir else None
        source = _runs_file(cfg.runs_from) if cfg.runs_from else (journal if cfg.resume else None)
        kept = load_runs(source, examples) if source is not None and source.is_file() else {}
        grouped: list[list[Run]] = [kept.get(i, [])[: cfg.num_plans] for i in range(len(examples))]
        jobs = [(i, e) for r in range(cfg.num_plans) for i, e in enumerate(examples) if r >= len(grouped[i])]
        reused = sum(len(g) for g in grouped)
        if reused:
            logger.info("STRIDEFT: %d runs reused from %s, %d to run", reused, source, len(jobs))
        writer = _Journal(journal, fresh=journal != source) if journal is not None else None
        if writer is not None and journal != source:
            for i, group in enumerate(grouped):  # the journal of this output_dir holds every run its selection read
                for reused_run in group:
                    writer.write(i, examples[i], reused_run)

        plan_roles = [r for r in ("meta_planner", "planner") if r in program.roles]
        saved = {r: dict(program.lm_kwargs.get(r, {})) for r in plan_roles}
        for role in plan_roles:
            program.lm_kwargs[role] = {**saved[role], "temperature": cfg.plan_temperature}
        bar = tqdm(total=len(jobs), desc="STRIDE-FT runs", disable=not cfg.show_progress or not jobs)

        deadline = None if cfg.collect_minutes is None else self.clock() + 60 * cfg.collect_minutes

        def run(job: tuple[int, Example]) -> tuple[int, Run | None]:
            index, example = job
            if deadline is not None and self.clock() >= deadline:
                bar.update(1)
                return index, None
            pred = program(question=example.question)
            plan = getattr(pred, "sub_questions", None) or []
            last = plan[-1]["id"] if plan else None
            result = Run(trajectory=pred.trajectory, outcome=score_run(pred, example.answers),
                         answers=list(example.answers), final_sub_question=last)  # fmt: skip
            if writer is not None:
                writer.write(index, example, result)
            bar.update(1)
            return index, result

        try:
            done = parallel_map(run, jobs, max_workers=cfg.num_threads) if jobs else []
        finally:
            bar.close()
            if writer is not None:
                writer.close()
            for role in plan_roles:
                program.lm_kwargs[role] = saved[role]
        not_started = 0
        for index, result in done:
            if result is None:
                not_started += 1
            else:
                grouped[index].append(result)
        self.selection["runs_not_started"] = not_started
        if not_started:
            logger.warning("STRIDEFT: collect_minutes=%s spent; %d of %d runs not started (resume=True runs them)",
                           cfg.collect_minutes, not_started, len(jobs))  # fmt: skip
        return grouped

    def _minimal_facts(self, program: STRIDE, runs: list[Run]) -> list[tuple[Step, list[str]]]:
        """E* of each eligible Extractor call, selected by the frozen model (or the answer rule)."""
        if self.ft_config.fact_selector == "answer":
            out = []
            for run in runs:
                answers = {s.meta.get("sub_question"): str(s.meta.get("answer") or "")
                           for s in run.trajectory.role_steps("reasoner")}  # fmt: skip
                for step in run.trajectory.role_steps("extractor"):
                    select = answer_bearing_facts(answers.get(step.meta.get("sub_question"), ""))
                    out += minimal_fact_targets([_only(run, step)], select)
            return out
        selector = dspy.Predict(SelectFacts)
        lm = program.roles["extractor"].lm or program.lm

        def select(query: str, facts: list[str]) -> list[str] | None:
            try:
                with dspy.context(lm=lm):
                    pred = selector(query=query, facts="\n".join(facts))
            except Exception as err:  # a malformed selection is no selection
                logger.debug("STRIDEFT fact selection failed: %s", err)
                return None
            return parse_facts(str(pred.get("required") or ""))

        eligible = [(r, s) for r in runs if r.outcome.correct for s in r.trajectory.role_steps("extractor")
                    if s.ok and len(s.meta.get("facts") or []) > 1]  # fmt: skip
        found = parallel_map(lambda rs: minimal_fact_targets([_only(*rs)], select), eligible,
                             max_workers=self.ft_config.num_threads)  # fmt: skip
        return [t for targets in found for t in targets]

    def _sample(self, program: STRIDE, step: Step, outputs: dict[str, Any] | None = None) -> TrainingSample:
        """The sample of ``step``'s call on the prompt its role sees now, with ``outputs`` (default: its own)."""
        new = copy.copy(step)
        new.messages, new.completion = format_pair(program, step.role, dict(step.inputs), dict(outputs or step.outputs))
        new.adapter = program.adapter_name(step.role)
        new.meta = {k: v for k, v in step.meta.items() if k != "sampled"}  # a formatted target, not what was sampled
        return samples_from_trajectory([new], program.lm)[0]

    def _mark_trained(self, program: STRIDE, adapters: Any) -> None:
        if self.ft_config.demo_free:
            for adapter in sorted(adapters):
                program.mark_trained(adapter)


def _leg(sample: TrainingSample) -> str:
    """The leg a sample trains (the Meta-Planner's strategy and plan calls both train the ``meta_planner`` leg)."""
    return "meta_planner" if sample.role in ("meta_planner", "planner") else sample.role


def _leg_adapter(program: STRIDE, leg: str) -> str | None:
    """The adapter a leg trains (the Meta-Planner leg is the planner's alone without a Meta-Planner); None if the
    program has no such role (an ablation removed it)."""
    role = "planner" if leg == "meta_planner" and "meta_planner" not in program.roles else leg
    return program.adapter_name(role) if role in program.roles else None


def _only(run: Run, step: Step) -> Run:
    """``run`` reduced to one of its steps, so a per-step selector sees one call."""
    trajectory = copy.copy(run.trajectory)
    trajectory.steps = [step]
    return Run(trajectory=trajectory, outcome=run.outcome, answers=run.answers,
               final_sub_question=run.final_sub_question)  # fmt: skip


def _runs_file(path: str | os.PathLike[str]) -> Path:
    """``path`` itself, or the ``runs.jsonl`` inside it when it is a folder."""
    path = Path(path)
    return path / RUNS_FILE if path.is_dir() else path


class _Journal:
    """Appends scored runs to ``runs.jsonl`` through a :class:`RecordWriter` (one flushed line each) from any thread."""

    def __init__(self, path: Path, *, fresh: bool) -> None:
        if fresh:
            path.unlink(missing_ok=True)  # RecordWriter makes the folder and a new file
        self._writer = RecordWriter(path)  # on a resumed journal, a line cut by a kill stays a bad line of its own
        self._lock = threading.Lock()

    def write(self, index: int, example: Example, run: Run) -> None:
        line = to_jsonable({
            "index": index, "question": example.question, "answers": run.answers,
            "final_sub_question": run.final_sub_question, "outcome": asdict(run.outcome), "meta": run.meta,
            "trajectory": run.trajectory.to_dict(),
        })  # fmt: skip
        with self._lock:
            self._writer.write_json(line)

    def close(self) -> None:
        self._writer.close()


def load_runs(path: str | os.PathLike[str], examples: Sequence[Example]) -> dict[int, list[Run]]:
    """The scored runs of a ``runs.jsonl`` journal, by the index of their question in ``examples``.

    A line that is not a valid run (one cut by a kill) is skipped with a warning, and so is a run whose question is
    not ``examples``' question at its index (the journal of another training set): those runs are run again.

    Args:
        path: the journal, or the folder holding it.
        examples: the training questions the journal was collected on.
    """
    path = _runs_file(path)
    out: dict[int, list[Run]] = {}
    foreign = 0
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            index = int(d["index"])
            run = Run(trajectory=Trajectory.from_dict(d["trajectory"]), outcome=Outcome(**d["outcome"]),
                      answers=list(d["answers"]), final_sub_question=d.get("final_sub_question"),
                      meta=dict(d.get("meta") or {}))  # fmt: skip
        except (ValueError, KeyError, TypeError) as err:
            logger.warning("%s:%d: not a scored run (%s); skipped, it will be run again", path, lineno, err)
            continue
        if not 0 <= index < len(examples) or examples[index].question != d.get("question"):
            foreign += 1
            continue
        out.setdefault(index, []).append(run)
    if foreign:
        logger.warning("%s: %d runs are of questions not in this training set at their position; not reused", path,
                       foreign)  # fmt: skip
    return out
