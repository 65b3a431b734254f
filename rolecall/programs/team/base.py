"""``TeamProgram``: what the MultiAgent-OPD teams share (arXiv 2610.23234): options, one LoRA adapter for all roles,
Searcher waves run turn by turn under an environment-step budget, and the Answerer's candidate vote.

:class:`~rolecall.programs.team.program.CascadedTeam` and :class:`~rolecall.programs.team.program.HierarchicalTeam` subclass it; the
Searcher's own turn is in :mod:`rolecall.programs.team.searcher`.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Literal

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.core.program import COMPLETED_MARKER, Program, is_local_lm, parallel_map
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.team.demos import default_team_demos
from rolecall.programs.team.searcher import SearcherRun, fallback_report, format_reports, majority_vote, searcher_turn

__all__ = ["TeamProgram", "StepBudget", "ParameterSharing", "SHARED_ADAPTER", "NO_SELECTED", "team_lm_kwargs"]

logger = logging.getLogger(__name__)

ParameterSharing = Literal["shared", "per_role"]
"""``"shared"``: one adapter and a role prompt for all roles (the paper); ``"per_role"``: one adapter per role."""

SHARED_ADAPTER = "team"
"""Default name of the one LoRA adapter every role uses in shared mode."""

NO_SELECTED = "no reports"
"""What the Answerer sees when it is handed no report."""

_MAX_TOKENS = {"leader": 96, "searcher": 64, "answerer": 32}
_STATE_FILE = "program.json"  # Program.save's file, read back to rebind shared adapters
_ADAPTER_DIR = "adapters"


def team_lm_kwargs(
    lm_kwargs: dict[str, dict[str, Any]] | None, roles: tuple[str, ...], answer_candidates: int
) -> dict[str, dict[str, Any]]:
    """The LM arguments of a team's roles: ``lm_kwargs``, or by default ChatAdapter's stop marker and per-role token
    budgets (leader 96, searcher 64, answerer 32); with ``answer_candidates > 1`` the Answerer draws that many samples
    (``n``) at temperature 1.0 unless its entry sets another temperature.

    Example:
        >>> team_lm_kwargs(None, ("searcher", "answerer"), 5)["answerer"]
        {'max_tokens': 32, 'n': 5, 'temperature': 1.0}
    """
    if lm_kwargs is None:
        lm_kwargs = {"*": {"stop": [COMPLETED_MARKER]}, **{r: {"max_tokens": _MAX_TOKENS[r]} for r in roles}}
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
    """Base of the MultiAgent-OPD teams: options, the shared adapter, Searcher waves and the voting Answerer.

    Subclasses create their roles (``searcher`` and ``answerer``, and ``leader`` for the hierarchy), call
    :meth:`_setup` with the shared options, then ``_set_initial_demos`` and ``_bind_lm``.
    """

    def _setup(
        self,
        *,
        top_k: int,
        answer_candidates: int,
        parameter_sharing: str,
        shared_adapter_name: str,
        max_passage_chars: int,
        max_notes_chars: int,
        max_report_chars: int,
    ) -> None:
        if top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {top_k}")
        if answer_candidates < 1:
            raise ConfigError(f"answer_candidates must be >= 1 (training uses 5), got {answer_candidates}")
        if parameter_sharing not in ("shared", "per_role"):
            raise ConfigError(f"parameter_sharing must be 'shared' or 'per_role', got {parameter_sharing!r}")
        if not shared_adapter_name or not isinstance(shared_adapter_name, str):
            raise ConfigError(f"shared_adapter_name must be a non-empty string, got {shared_adapter_name!r}")
        if max_passage_chars < 20 or max_notes_chars < max_passage_chars or max_report_chars < 20:
            raise ConfigError(
                "need 20 <= max_passage_chars <= max_notes_chars and max_report_chars >= 20, got "
                f"{max_passage_chars}, {max_notes_chars} and {max_report_chars}"
            )
        self.top_k, self.answer_candidates = top_k, answer_candidates
        self.parameter_sharing, self.shared_adapter_name = parameter_sharing, shared_adapter_name
        self.max_passage_chars, self.max_notes_chars = max_passage_chars, max_notes_chars
        self.max_report_chars = max_report_chars
        self._config |= {
            "top_k": top_k,
            "answer_candidates": answer_candidates,
            "parameter_sharing": parameter_sharing,
            "shared_adapter_name": shared_adapter_name,
            "max_passage_chars": max_passage_chars,
            "max_notes_chars": max_notes_chars,
            "max_report_chars": max_report_chars,
        }

    def _set_initial_demos(self, demos: Any) -> None:
        if demos is None:
            return
        if isinstance(demos, str):
            if demos != "auto":
                raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
            self.set_demos({role: d for role, d in default_team_demos().items() if role in self.roles})
        elif isinstance(demos, dict):
            self.set_demos(demos)  # raises ConfigError on a role this team does not have
        else:
            raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {type(demos).__name__}")

    # ------------------------------------------------------------------ one adapter for the team
    def bind_role_adapters(self, local_lm: Any) -> None:
        """Bind ``local_lm``'s adapters: in shared mode one view ``for_role(shared_adapter_name)`` for every role,
        in per-role mode one adapter per role (see :meth:`Program.bind_role_adapters`)."""
        if self.parameter_sharing == "per_role":
            super().bind_role_adapters(local_lm)
            return
        if not hasattr(local_lm, "for_role"):
            raise ConfigError(f"bind_role_adapters needs a rolecall LocalLM, got {type(local_lm).__name__}")
        team = local_lm.for_role(self.shared_adapter_name)
        for role in self.roles:
            self.set_role_lm(role, team)

    def _bind_lm(self) -> None:
        if self.parameter_sharing == "shared" and self.lm is not None and is_local_lm(self.lm):
            self.bind_role_adapters(self.lm)  # one adapter whatever per_role_adapters says
        else:
            super()._bind_lm()

    # ------------------------------------------------------------------ Searchers and the Answerer
    def _run_wave(self, runs: list[SearcherRun], trajectory: Trajectory, clock: StepBudget, *, max_turns: int) -> None:
        """Run ``runs`` turn by turn, all working Searchers at once, until each reported or a limit was reached."""
        active, turn = list(runs), 0
        while active:
            if clock.left <= 0 or turn >= max_turns:
                name = "budget_exhausted" if clock.left <= 0 else "searcher_turn_limit"
                for run in active:
                    run.report, run.forced = fallback_report(run, max_report_chars=self.max_report_chars), True
                step = trajectory.event(
                    name, wave=runs[0].wave, turn=turn, searchers=[r.index for r in active], max_steps=clock.max_steps
                )
                limit = f"step budget of {clock.max_steps}" if name == "budget_exhausted" else f"{max_turns} turns"
                step.error = f"{limit} spent before Searchers {[r.index for r in active]} reported"
                return
            turn_fn = functools.partial(
                searcher_turn,
                self,
                turn=turn,
                env_step=clock.tick(),
                top_k=self.top_k,
                max_passage_chars=self.max_passage_chars,
                max_notes_chars=self.max_notes_chars,
                max_report_chars=self.max_report_chars,
            )
            for steps in parallel_map(turn_fn, active):  # the steps join the trajectory in Searcher order
                for step in steps:
                    trajectory.add(step)
            active = [r for r in active if r.report is None]
            turn += 1

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
        # one malformed sample fails the whole n-sample call: parse the first attempt's samples one by one
        attempts = step.meta.get("attempts")
        texts = attempts[0]["completions"] if attempts else step.meta.get("completions") or [step.completion or ""]
        adapter = self.adapter or dspy.settings.adapter or dspy.ChatAdapter()
        signature = self._predictor("answerer").signature
        candidates: list[str | None] = []
        for text in texts:
            try:
                candidates.append(_clean(adapter.parse(signature, text).get("answer")))
            except Exception:  # an unparseable sample is a failed candidate
                candidates.append(None)
        if any(c is not None for c in candidates):
            trajectory.event("candidates_recovered", parsed=sum(c is not None for c in candidates), total=len(texts))
        return candidates


def _clean(answer: Any) -> str | None:
    text = " ".join(str(answer).split()) if answer is not None else ""
    return text or None
