"""MultiAgent-OPD (arXiv 2610.23234) on rolecall: the paper's main table and its outcome-only ablation.

Rows (experiments/configs/multiagent_opd.toml): C-MAS base and H-MAS base (prompt-only cascaded and hierarchical
teams), C-MAS SFT(gold) and C-MAS + RL (Stage I GRPO from it: the Teacher), H-MAS SFT(gold), and from it MultiAgent-OPD
(Stage II, Searchers distilled from the Teacher row's program) and the outcome-only ablation. The paper reports a macro
avg@4 over its datasets; the report adds our macro EM over the real datasets run. Datasets: the synthetic world and the
real dev subsets in ../shared/data (closed corpus, BM25, 80/20 hash split).

Each row's program is saved under runs/experiments/multiagent_opd/<dataset>/<row>/program with a train.json (minutes,
steps, what it was trained on); evaluation records go to .../<row>/eval. Each finished row is written at once to
experiments/results/multiagent_opd.json, .md and .png (EM with 95% CI per row, the paper's numbers as red markers), so
a killed run keeps its finished rows and a rerun resumes the rest (saved programs are reused, evaluations resume). At
the default size (the config's [sizes.default]) it takes about 5.5 h on 2 CPU cores (estimated); --report-only also
rewrites this paper's block of experiments/README.md.

Usage::

    .venv/bin/python experiments/multiagent_opd.py --plan   # what each row trains on, and for how long; runs nothing
    .venv/bin/python experiments/multiagent_opd.py          # default size, every dataset and row
    .venv/bin/python experiments/multiagent_opd.py --datasets synthetic,musique --rows team_sft,opd
    .venv/bin/python experiments/multiagent_opd.py --size smoke --datasets synthetic   # seconds of training (tests)
    .venv/bin/python experiments/multiagent_opd.py --report-only   # rebuild the report from the results JSON
"""

from __future__ import annotations

import sys

from _paper_cli import main  # the shared runner beside this script (Python puts its folder on the path)

PAPER = "multiagent_opd"


def run(argv: list[str] | None = None) -> int:
    """Run (or report) this paper's experiment with command-line ``argv``; returns the exit status."""
    return main(PAPER, __doc__, argv)


if __name__ == "__main__":
    sys.exit(run())
