"""MultiAgent-OPD teams: the cascaded Searcher -> Answerer workflow and the hierarchical Leader-Searcher-Answerer team.

Zhao et al., "MultiAgent-OPD: End-to-End Training of Hierarchical Multi-Agent Systems with On-Policy Distillation",
arXiv 2610.23234. Control flow (Sec. 3.1 and App. B.2):

    CascadedTeam (C-MAS, the Stage-I Teacher's workflow), at most 5 environment steps:
        repeat: (action, content) = Searcher(q, notes)          # one ReAct turn
                if action = search: notes += retrieve(content, k=3)
        until action = report
        a = Answerer(q, report)

    HierarchicalTeam (H-MAS, the Stage-II student), at most 12 environment steps and 5 delegation rounds:
        reports = []
        for round r = 1, 2, ...:
            (action, subtasks, selected) = Leader(q, reports)
            if action = answer (or r > 5): break
            wave r: one Searcher per subtask, all at once, each as above; reports += their reports
        a = Answerer(q, reports[selected])                      # answer_candidates samples, majority vote

An environment step is one synchronous turn of the team: a Leader turn, or one turn of every still-working Searcher of
a wave (run concurrently). With one Searcher, as in the cascaded workflow, a search is one environment step. The
Answerer's call closes the episode and is not counted. C_tool of the Leader reward R_L = 0.9 R_EM + 0.1 min(C_tool, 6)/6
(Eq. 6) counts the steps with at least one Searcher search: :func:`tool_steps`.

All roles share one model in the paper, with a role prompt selecting the role: ``parameter_sharing="shared"`` makes
every role one adapter group (one LoRA adapter of a ``LocalLM``, named ``shared_adapter_name``); ``"per_role"`` gives
each role its own adapter. An explicit ``adapter_groups=`` overrides either.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import dspy

from rolecall.programs.core.options import ProgramOptions
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.team.base import StepBudget, TeamProgram
from rolecall.programs.team.options import CascadedOptions, HierarchicalOptions
from rolecall.programs.team.searcher import SearcherRun, format_reports
from rolecall.signatures.team import DelegateOrAnswer

__all__ = ["CascadedTeam", "HierarchicalTeam", "tool_steps"]

logger = logging.getLogger(__name__)


def tool_steps(trajectory: Trajectory) -> int:
    """C_tool of Eq. 6: environment steps holding at least one Searcher search action.

    A search action is a Searcher turn whose own output asked for a search with a non-empty query (``meta["valid"]``);
    searches the program ran in place of an unusable output do not count, as the paper counts only recorded
    ``<search>`` actions.

    Example:
        >>> from rolecall.programs.core.trajectory import Step
        >>> t = Trajectory()
        >>> for n, action in [(1, "search"), (1, "search"), (2, "report"), (3, "search")]:
        ...     _ = t.add(Step("role", "searcher", meta={"env_step": n, "action": action, "valid": True}))
        >>> tool_steps(t)
        2
    """
    return len(
        {
            s.meta["env_step"]
            for s in trajectory.role_steps("searcher")
            if s.meta.get("action") == "search" and s.meta.get("valid") and "env_step" in s.meta
        }
    )


class CascadedTeam(TeamProgram):
    """The cascaded Searcher -> Answerer workflow (C-MAS): one Searcher works on the question itself, then the
    Answerer answers from its report.

    Zhao et al., arXiv 2610.23234, Sec. 3.2: the Stage-I workflow, trained with R_A = c_ij and
    R_S = 0.9 R_EM + 0.1 b_S, then frozen as the Teacher π_T (evaluated as "C-MAS + RL"). Roles: ``searcher``
    (subtask, notes -> search | report) and ``answerer`` (question, reports -> answer). Options:
    :class:`~rolecall.programs.team.options.CascadedOptions` (default token budgets: searcher 64, answerer 32).

    Example:
        >>> team = CascadedTeam(BM25(world.corpus), lm=LocalLM())        # doctest: +SKIP
        >>> pred = team(question=world.test[0].question)                 # doctest: +SKIP
        >>> pred.answer, pred.report, tool_steps(pred.trajectory)        # doctest: +SKIP
    """

    Options: ClassVar[type[ProgramOptions]] = CascadedOptions
    ROLES: ClassVar[tuple[str, ...]] = ("searcher", "answerer")
    MAX_TOKENS: ClassVar[dict[str, int]] = {"searcher": 64, "answerer": 32}

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        """``Prediction(answer, trajectory, report, candidates, tool_steps, env_steps)``."""
        budget = StepBudget(self.max_steps)
        run = SearcherRun(index=1, subtask=question, wave=1)
        self._run_wave([run], trajectory, budget, max_turns=self.max_steps)
        answer, candidates = self._answer(question, [run], trajectory)
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            report=run.report or "",
            candidates=candidates,
            tool_steps=tool_steps(trajectory),
            env_steps=budget.used,
        )


class HierarchicalTeam(TeamProgram):
    """The hierarchical Leader-Searcher-Answerer team (H-MAS): the Leader delegates subtasks to waves of concurrent
    Searchers, reads their reports, and hands the reports it selects to the Answerer.

    Zhao et al., arXiv 2610.23234, Sec. 3.1 and 3.3: the Stage-II student of MultiAgent-OPD, trained with
    R_L = 0.9 R_EM + 0.1 min(C_tool, 6)/6 for the Leader (see :func:`tool_steps`), R_A = c_ij for the Answerer and
    on-policy distillation from the cascaded Teacher for the Searchers. Roles: ``leader`` (question, reports ->
    delegate subtasks | answer with selected reports), ``searcher`` and ``answerer`` as in :class:`CascadedTeam`.
    Options: :class:`~rolecall.programs.team.options.HierarchicalOptions` (default token budgets: leader 96,
    searcher 64, answerer 32).

    Example:
        >>> team = HierarchicalTeam(BM25(world.corpus), lm=LocalLM())    # doctest: +SKIP
        >>> pred = team(question=world.test[0].question)                 # doctest: +SKIP
        >>> pred.answer, pred.reports, pred.selected, pred.tool_steps    # doctest: +SKIP
    """

    Options: ClassVar[type[ProgramOptions]] = HierarchicalOptions
    ROLES: ClassVar[tuple[str, ...]] = ("leader", "searcher", "answerer")
    MAX_TOKENS: ClassVar[dict[str, int]] = {"leader": 96, "searcher": 64, "answerer": 32}

    def _build_roles(self) -> None:
        self.leader = dspy.Predict(DelegateOrAnswer)
        super()._build_roles()

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        """``Prediction(answer, trajectory, reports, selected, candidates, tool_steps, env_steps, rounds)``."""
        budget = StepBudget(self.max_steps)
        runs: list[SearcherRun] = []
        selected: list[int] | None = None
        waves = 0
        for round_ in range(1, self.max_rounds + 2):
            if budget.left <= 0:
                step = trajectory.event("budget_exhausted", round=round_, max_steps=self.max_steps)
                step.error = f"step budget of {self.max_steps} spent before Leader round {round_}"
                break
            action, subtasks, numbers = self._lead(question, runs, trajectory, round_, budget.tick())
            if action == "answer":
                selected = numbers
                break
            if round_ > self.max_rounds:
                step = trajectory.event("round_limit", round=round_, max_rounds=self.max_rounds, subtasks=subtasks)
                step.error = f"the Leader delegated again after {self.max_rounds} rounds"
                break
            wave = [SearcherRun(len(runs) + i, text, wave=round_) for i, text in enumerate(subtasks, start=1)]
            runs.extend(wave)
            waves += 1
            self._run_wave(wave, trajectory, budget, max_turns=self.max_searcher_turns)
        if selected is None:  # the Leader never chose: every report goes to the Answerer
            selected = [r.index for r in runs]
            trajectory.event("fallback", role="leader", reason="no selection", replaced_by="all reports")
        chosen = [r for r in runs if r.index in set(selected)]
        answer, candidates = self._answer(question, chosen, trajectory)
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            reports=[r.as_dict() for r in runs],
            selected=selected,
            candidates=candidates,
            tool_steps=tool_steps(trajectory),
            env_steps=budget.used,
            rounds=waves,
        )

    def _lead(
        self, question: str, runs: list[SearcherRun], trajectory: Trajectory, round_: int, env_step: int
    ) -> tuple[str, list[str], list[int]]:
        """One Leader turn: ``("delegate", subtasks, [])`` or ``("answer", [], report numbers)``, after fallbacks."""
        reports = format_reports(runs, max_report_chars=self.max_report_chars)
        pred = self.call_role("leader", trajectory, question=question, reports=reports)
        step = trajectory.steps[-1]  # the Leader runs alone, so the last step is its own
        action = str(pred.get("action") or "").strip().lower() if pred is not None else ""
        subtasks = _subtasks(pred.get("subtasks") if pred is not None else None)
        numbers = _report_numbers(pred.get("selected") if pred is not None else None, len(runs))
        reason = None
        if action == "delegate" and subtasks:
            if len(subtasks) > self.max_subtasks:
                trajectory.event("subtasks_truncated", round=round_, planned=len(subtasks), kept=self.max_subtasks)
                subtasks = subtasks[: self.max_subtasks]
            numbers = []
        elif action == "answer" and (numbers or not runs):
            subtasks = []
        else:
            reason = {"": "unparseable output", "delegate": "delegate without subtasks"}.get(
                action, "no valid selection"
            )
        if reason is not None:  # first round: search the question itself; later: answer from every report
            action = "answer" if runs else "delegate"
            subtasks, numbers = ([], [r.index for r in runs]) if runs else ([question], [])
            event = trajectory.event("fallback", role="leader", reason=reason, replaced_by=action, round=round_)
            if pred is not None:
                event.error = f"leader output unusable: {reason}"
        step.meta.update(
            round=round_, env_step=env_step, action=action, subtasks=subtasks, selected=numbers, valid=reason is None
        )
        return action, subtasks, numbers


def _subtasks(raw: Any) -> list[str]:
    """Non-empty, distinct subtasks in order."""
    items = raw if isinstance(raw, list) else ([raw] if raw else [])
    cleaned = [" ".join(str(s).split()) for s in items]
    return list(dict.fromkeys(s for s in cleaned if s))


def _report_numbers(raw: Any, n_reports: int) -> list[int]:
    """Distinct report numbers in ``1..n_reports``, in order (anything else dropped)."""
    numbers: list[int] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            number = int(str(item).strip().strip("[]"))
        except ValueError:
            continue
        if 1 <= number <= n_reports and number not in numbers:
            numbers.append(number)
    return numbers
