"""Options of the MultiAgent-OPD teams (arXiv 2610.23234): what both teams share, and each team's own limits.

The paper's settings are the defaults: top-3 passages per search, one model for every role (``"shared"``), 5
environment steps for the cascaded workflow and 12 with at most 5 delegation rounds for the hierarchy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rolecall.errors import ConfigError
from rolecall.programs.core.options import ProgramOptions, option

__all__ = ["ParameterSharing", "SHARED_ADAPTER", "TeamOptions", "CascadedOptions", "HierarchicalOptions"]

ParameterSharing = Literal["shared", "per_role"]
"""``"shared"``: one adapter and a role prompt for all roles (the paper); ``"per_role"``: one adapter per role."""

SHARED_ADAPTER = "team"
"""Default name of the one LoRA adapter every role uses in shared mode."""


@dataclass(kw_only=True)
class TeamOptions(ProgramOptions):
    """Options both teams share: retrieval, the Answerer's samples, parameter sharing and the prompt sizes."""

    top_k: int = option(3, low=1)
    """Passages per search (the paper's retriever returns 3)."""
    answer_candidates: int = option(1, low=1)
    """Answerer samples per request, at temperature 1.0 unless ``lm_kwargs`` sets another; the answer is their
    majority (the paper samples 5 in training; evaluation uses 1)."""
    parameter_sharing: ParameterSharing = "shared"
    """``"shared"``: every role runs on one LoRA adapter of a ``LocalLM``, named ``shared_adapter_name``, and the role
    prompt selects the role (the paper); ``"per_role"``: one adapter per role. Other LMs serve all roles either way."""
    shared_adapter_name: str = SHARED_ADAPTER
    """Name of the shared adapter; give the Teacher and the student different names when they share one ``LocalLM``."""
    max_passage_chars: int = option(250, low=20)
    """Characters of one passage in a Searcher's notes."""
    max_notes_chars: int = option(900, low=20)
    """Characters of a Searcher's notes, at least ``max_passage_chars`` (older searches shrink to their query line
    first)."""
    max_report_chars: int = option(200, low=20)
    """Characters of one report shown to the Leader or the Answerer."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.shared_adapter_name.strip():
            raise ConfigError(
                f"option shared_adapter_name must be a non-empty string, got {self.shared_adapter_name!r}"
            )
        if self.max_notes_chars < self.max_passage_chars:
            raise ConfigError(
                f"option max_notes_chars ({self.max_notes_chars}) must be >= max_passage_chars "
                f"({self.max_passage_chars})"
            )


@dataclass(kw_only=True)
class CascadedOptions(TeamOptions):
    """Options of the cascaded Searcher -> Answerer workflow."""

    max_steps: int = option(5, low=1)
    """Environment steps (Searcher turns) per question (the paper's 5); when spent before the Searcher reports, its
    last passage becomes the report and ``budget_exhausted`` is recorded."""


@dataclass(kw_only=True)
class HierarchicalOptions(TeamOptions):
    """Options of the Leader-Searcher-Answerer hierarchy."""

    max_steps: int = option(12, low=1)
    """Environment steps per question (the paper's 12): Leader turns and Searcher turns, the Searchers of a wave
    taking theirs together as one step. When spent, Searchers still working get their last passage as a report, the
    reports go to the Answerer unselected, and ``budget_exhausted`` is recorded."""
    max_rounds: int = option(5, low=1)
    """Delegation rounds (the paper's 5). After the last wave the Leader may only answer; a further delegation is
    recorded as ``round_limit`` and every report goes to the Answerer."""
    max_subtasks: int = option(3, low=1)
    """Searchers per wave; longer lists are cut (recorded as ``subtasks_truncated``)."""
    max_searcher_turns: int = option(4, low=1)
    """Turns of one Searcher in a wave before its last passage stands in for its report (``searcher_turn_limit``);
    the paper bounds Searchers by the step budget only."""
