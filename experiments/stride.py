"""STRIDE + STRIDE-FT (SIGIR 2026) on rolecall: the paper's main table (EM / F1) and its w/o Supervisor ablation.

Rows (experiments/configs/stride.toml): STRIDE prompt-only (the paper's training-free STRIDE), STRIDE w/o Supervisor
(synthetic and MuSiQue), STRIDE SFT(gold), and SFT + STRIDE-FT (from the system's own runs, warm-started from the
SFT(gold) row's program). Datasets: the synthetic world and the real dev subsets in ../shared/data (closed corpus,
BM25, 80/20 hash split); HotpotQA has no gold decompositions, so its SFT(gold) row is trained on the synthetic world.

Each row's program is saved under runs/experiments/stride/<dataset>/<row>/program with a train.json (minutes, steps,
what it was trained on); evaluation records go to .../<row>/eval. Each finished row is written at once to
experiments/results/stride.json, .md and .png (EM with 95% CI per row, the paper's numbers as red markers), so a
killed run keeps its finished rows and a rerun resumes the rest (saved programs are reused, evaluations resume). At
the default size (the config's [sizes.default]) it takes about 4 h on 2 CPU cores (estimated); --report-only also
rewrites this paper's block of experiments/README.md.

Usage::

    .venv/bin/python experiments/stride.py --plan          # what each row trains on, and for how long; runs nothing
    .venv/bin/python experiments/stride.py                 # default size, every dataset and row
    .venv/bin/python experiments/stride.py --datasets synthetic,musique --rows sft,stride_ft
    .venv/bin/python experiments/stride.py --size smoke --datasets synthetic   # seconds of training (tests)
    .venv/bin/python experiments/stride.py --report-only   # rebuild the report from the results JSON
"""

from __future__ import annotations

import sys

from _paper_cli import main  # the shared runner beside this script (Python puts its folder on the path)

PAPER = "stride"


def run(argv: list[str] | None = None) -> int:
    """Run (or report) this paper's experiment with command-line ``argv``; returns the exit status."""
    return main(PAPER, __doc__, argv)


if __name__ == "__main__":
    sys.exit(run())
