"""The MultiAgent-OPD teams (arXiv 2610.23234): cascaded Searcher -> Answerer and the Leader-led hierarchy."""

from rolecall.programs.team.options import CascadedOptions, HierarchicalOptions, TeamOptions
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam, tool_steps

__all__ = ["CascadedTeam", "HierarchicalTeam", "tool_steps", "TeamOptions", "CascadedOptions", "HierarchicalOptions"]
