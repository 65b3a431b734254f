"""``TeamProgram``: what the MultiAgent-OPD teams share (arXiv 2610.23234): the Searcher and Answerer roles, one LoRA
adapter for every role in shared mode, Searcher waves run turn by turn under an environment-step budget, and the
Answerer's candidate vote.

:class:`~rolecall.programs.team.program.CascadedTeam` and :class:`~rolecall.programs.team.program.HierarchicalTeam`
subclass it; a Searcher's turns are in :mod:`rolecall.programs.team.searcher`.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import dspy

from rolecall.programs.core.calls import read_sections
from rolecall.programs.core.options import ProgramOptions
from rolecall.programs.core.parallel import run_branches
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.team.demos import default_team_demos
from rolecall.programs.team.options import SHARED_ADAPTER, ParameterSharing, TeamOptions
from rolecall.programs.team.searcher import Searcher, SearcherRun, fallback_report, format_reports, majority_vote
from rolecall.signatures.team import AnswerFromReports, SearchOrReport

__all__ = ["TeamProgram", "StepBudget", "ParameterSharing", "SHARED_ADAPTER", "NO_SELECTED", "team_lm_kwargs"]

logger = logging.getLogger(__name__)

NO_SELECTED = "no reports"
"""What the Answerer sees when it is handed no report."""


def team_lm_kwargs(lm_kwargs: dict[str, dict[str, Any]], answer_candidates: int) -> dict[str, dict[str, Any]]:
    """``lm_kwargs`` with the Answerer's sampling: with ``answer_candidates > 1`` it draws that many samples (``n``)
    at temperature 1.0 unless its entry sets another temperature; with one candidate, no ``n``.

    Example:
        >>> team_lm_kwargs({"answerer": {"max_tokens": 32}}, 5)["answerer"]
        {'max_tokens': 32, 'n': 5, 'temperature': 1.0}
    """
    lm_kwargs = {key: dict(value) for key, value in lm_kwargs.items()}
    answerer = lm_kwargs.setdefault("answerer", {})
    if answer_candidates > 1:
        answerer["n"] = answer_candidates
        answerer.setdefault("temperature", 1.0)
    else:
        answerer.pop("n", None)
    return lm_kwargs


@dataclass
class StepBudget:
    """The environment-step budget of one question: `max_steps`, of which `used` are spent."""

    max_steps: int
    used: int = 0

    @property
    def left(self) -> int:
        return self.max_steps - self.used

    def tick(self) -> int:
        """Spend one step and return its number (1-based)."""
        self.used += 1
        return self.used


class TeamProgram(Program):
    """Base of the MultiAgent-OPD teams: the Searcher and Answerer roles, the shared adapter, Searcher waves and the
    voting Answerer.

    Subclasses set ``Options`` (a :class:`~rolecall.programs.team.options.TeamOptions`), ``ROLES`` and
    ``MAX_TOKENS``, add their own roles in ``_build_roles`` (before calling this one, so the roles keep the paper's
    order) and write ``_run``. The default ``lm_kwargs`` are ChatAdapter's stop marker and ``MAX_TOKENS``, plus the
    Answerer's sampling (:func:`team_lm_kwargs`).
    """

    Options: ClassVar[type[ProgramOptions]] = TeamOptions
    ROLES: ClassVar[tuple[str, ...]] = ("searcher", "answerer")
    MAX_TOKENS: ClassVar[dict[str, int]] = {"searcher": 64, "answerer": 32}

    options: TeamOptions

    def _build_roles(self) -> None:
        self.lm_kwargs = team_lm_kwargs(self.lm_kwargs, self.answer_candidates)
        # roles: plain attributes so named_predictors() and DSPy's optimizers see them
        self.searcher = dspy.Predict(SearchOrReport)
        self.answerer = dspy.Predict(AnswerFromReports)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """The built-in team demos of this team's roles (:func:`~rolecall.programs.team.demos.team_demos`)."""
        return {role: demos for role, demos in default_team_demos().items() if role in self.ROLES}

    def default_adapter_groups(self) -> dict[str, list[str]]:
        """Shared mode: one adapter ``shared_adapter_name`` for every role (the paper); per-role mode: none."""
        if self.parameter_sharing == "per_role":
            return {}
        return {self.shared_adapter_name: list(self.roles)}

    # ------------------------------------------------------------------ Searchers and the Answerer
    def _run_wave(self, runs: list[SearcherRun], trajectory: Trajectory, clock: StepBudget, *, max_turns: int) -> None:
        """Run ``runs`` turn by turn, all working Searchers at once, until each reported or a limit was reached."""
        active = [Searcher(self, run, self.options, max_turns=max_turns) for run in runs]
        turn = 0
        while active:
            if clock.left <= 0 or turn >= max_turns:
                self._force_reports([s.run for s in active], trajectory, clock, turn=turn, max_turns=max_turns)
                return
            # one environment step: every working Searcher's turn, their steps joining in Searcher order
            run_branches(functools.partial(Searcher.turn, env_step=clock.tick()), active, trajectory)
            active = [s for s in active if s.run.report is None]
            turn += 1

    def _force_reports(
        self, runs: list[SearcherRun], trajectory: Trajectory, clock: StepBudget, *, turn: int, max_turns: int
    ) -> None:
        """A limit was reached: each still-working Searcher's last passage becomes its report; one event says so."""
        for run in runs:
            run.report, run.forced = fallback_report(run, max_report_chars=self.max_report_chars), True
        name = "budget_exhausted" if clock.left <= 0 else "searcher_turn_limit"
        indices = [r.index for r in runs]
        step = trajectory.event(name, wave=runs[0].wave, turn=turn, searchers=indices, max_steps=clock.max_steps)
        limit = f"step budget of {clock.max_steps}" if name == "budget_exhausted" else f"{max_turns} turns"
        step.error = f"{limit} spent before Searchers {indices} reported"

    def _answer(self, question: str, runs: list[SearcherRun], trajectory: Trajectory) -> tuple[str, list[str | None]]:
        """Call the Answerer on the reports of ``runs``; the answer is the majority of its candidates."""
        shown = format_reports(runs, max_report_chars=self.max_report_chars, empty=NO_SELECTED)
        pred = self.call_role("answerer", trajectory, question=question, reports=shown)
        step = trajectory.steps[-1]  # the Answerer runs alone, so the last step is its own
        candidates = self._candidates(pred, step, trajectory)
        answer, votes = majority_vote(candidates)
        step.meta.update(reports=[r.index for r in runs], candidates=candidates, votes=votes, chosen=answer)
        return answer, candidates

    def _candidates(self, pred: dspy.Prediction | None, step: Step, trajectory: Trajectory) -> list[str | None]:
        """The Answerer's candidate answers (None for a candidate that did not parse)."""
        if pred is not None:
            completions = getattr(pred, "completions", None)
            if self.answer_candidates > 1 and completions is not None and len(completions) > 1:
                return [_clean(a) for a in completions.answer]
            return [_clean(pred.get("answer"))]
        if self.answer_candidates == 1:
            return [None]
        # one malformed sample fails the whole n-sample call: read the first attempt's samples one by one (each
        # sample is a vote, so repeats are kept). LocalLM answers n > 1 as n one-sample LM calls, recorded as n
        # attempts with the same messages; DSPy's JSON fallback, if any, comes after them with other messages
        attempts = step.meta.get("attempts")
        if attempts:
            first = attempts[0]["messages"]
            texts = [t for a in attempts if a["messages"] == first for t in a["completions"]]
        else:
            texts = step.meta.get("completions") or [step.completion or ""]
        candidates = [_clean(read_sections(text, ["answer"]).get("answer")) for text in texts]
        if any(c is not None for c in candidates):
            trajectory.event("candidates_recovered", parsed=sum(c is not None for c in candidates), total=len(texts))
        return candidates


def _clean(answer: Any) -> str | None:
    text = " ".join(str(answer).split()) if answer is not None else ""
    return text or None
