"""OPERA + MAPGRPO (arXiv 2508.16438) on rolecall: the paper's main table and MuSiQue ablations.

Rows (experiments/configs/opera.toml): OPERA prompt-only (the paper's "OPERA CoT"), IRCoT, OPERA BootstrapFewShot
(synthetic only), OPERA SFT(gold), SFT + GRPO (JointGRPO) and SFT + MAPGRPO (both warm-started from the SFT(gold)
row's saved program), and the trained MAPGRPO system evaluated w/o Plan Agent, w/o Rewrite and w/o both (synthetic and
MuSiQue). Datasets: the synthetic world and the real dev subsets in ../shared/data (HotpotQA, 2Wiki, MuSiQue; closed
corpus, BM25, 80/20 hash split); HotpotQA has no gold decompositions, so its trained rows are trained on the synthetic
world ("trained on synthetic, evaluated on hotpotqa" in the output).

Each row's program is saved under runs/experiments/opera/<dataset>/<row>/program with a train.json (minutes, steps,
what it was trained on); evaluation records go to .../<row>/eval. Each finished row is written at once to
experiments/results/opera.json, .md and .png (EM with 95% CI per row, the paper's numbers as red markers), so a killed
run keeps its finished rows and a rerun resumes the rest (saved programs are reused, evaluations resume). At the
default size (the config's [sizes.default]) it takes about 4.5 h on 2 CPU cores (estimated); --report-only also
rewrites this paper's block of experiments/README.md.

Usage::

    .venv/bin/python experiments/opera.py --plan          # what each row trains on, and for how long; runs nothing
    .venv/bin/python experiments/opera.py                 # default size, every dataset and row
    .venv/bin/python experiments/opera.py --datasets synthetic,musique --rows sft,mapgrpo
    .venv/bin/python experiments/opera.py --size smoke --datasets synthetic   # seconds of training (tests)
    .venv/bin/python experiments/opera.py --report-only   # rebuild the report from the results JSON
"""

from __future__ import annotations

import sys

from _paper_cli import main  # the shared runner beside this script (Python puts its folder on the path)

PAPER = "opera"


def run(argv: list[str] | None = None) -> int:
    """Run (or report) this paper's experiment with command-line ``argv``; returns the exit status."""
    return main(PAPER, __doc__, argv)


if __name__ == "__main__":
    sys.exit(run())
