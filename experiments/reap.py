"""REAP (arXiv 2511.09966) on rolecall: the paper's main table (F1) and its w/o Re-Planner ablation.

Rows (experiments/configs/reap.toml): REAP prompt-only, REAP SFT(gold), REAP multi-task SFT (the paper's training:
one adapter for the Decomposer and Re-Planner, warm-started from SFT(gold)), that program w/o Re-Planner, IRCoT, and
Search-R1 + GRPO standing in for R1-Searcher. Datasets: the synthetic world and the real dev subsets in ../shared/data
(HotpotQA, 2Wiki, MuSiQue; closed corpus, BM25, 80/20 hash split); HotpotQA has no gold decompositions, so its SFT rows
are trained on the synthetic world. REAP reports F1: its paper column is F1.

Each row's program is saved under runs/experiments/reap/<dataset>/<row>/program with a train.json (minutes, steps,
what it was trained on); evaluation records go to .../<row>/eval. Each finished row is written at once to
experiments/results/reap.json, .md and .png (EM with 95% CI per row, the paper's numbers as red markers), so a killed
run keeps its finished rows and a rerun resumes the rest (saved programs are reused, evaluations resume). At the
default size (the config's [sizes.default]) it takes about 4 h on 2 CPU cores (estimated); --report-only also rewrites
this paper's block of experiments/README.md.

Usage::

    .venv/bin/python experiments/reap.py --plan          # what each row trains on, and for how long; runs nothing
    .venv/bin/python experiments/reap.py                 # default size, every dataset and row
    .venv/bin/python experiments/reap.py --datasets synthetic,musique --rows sft,multitask
    .venv/bin/python experiments/reap.py --size smoke --datasets synthetic   # seconds of training (tests)
    .venv/bin/python experiments/reap.py --report-only   # rebuild the report from the results JSON
"""

from __future__ import annotations

import sys

from _paper_cli import main  # the shared runner beside this script (Python puts its folder on the path)

PAPER = "reap"


def run(argv: list[str] | None = None) -> int:
    """Run (or report) this paper's experiment with command-line ``argv``; returns the exit status."""
    return main(PAPER, __doc__, argv)


if __name__ == "__main__":
    sys.exit(run())
