"""D2Plan (arXiv 2601.08282) on rolecall: the paper's main table (EM) and the ablations that apply.

Rows (experiments/configs/d2plan.toml): no-retrieval CoT, single-step RAG, Search-R1 prompt-only and + GRPO (the
paper's Search-R1 baseline), D2Plan prompt-only, SFT(gold) (the cold start), SFT + SPlanRL (the paper's D2Plan), SFT +
SPlanRL w/o R_p, and the SPlanRL program w/o Purifier. Datasets: the synthetic world and the real dev subsets in
../shared/data (closed corpus, BM25, 80/20 hash split); HotpotQA has no gold decompositions, so its SFT(gold) cold
start is trained on the synthetic world.

Each row's program is saved under runs/experiments/d2plan/<dataset>/<row>/program with a train.json (minutes, steps,
what it was trained on); evaluation records go to .../<row>/eval. Each finished row is written at once to
experiments/results/d2plan.json, .md and .png (EM with 95% CI per row, the paper's numbers as red markers), so a
killed run keeps its finished rows and a rerun resumes the rest (saved programs are reused, evaluations resume). At
the default size (the config's [sizes.default]) it takes about 5 h on 2 CPU cores (estimated); --report-only also
rewrites this paper's block of experiments/README.md.

Usage::

    .venv/bin/python experiments/d2plan.py --plan          # what each row trains on, and for how long; runs nothing
    .venv/bin/python experiments/d2plan.py                 # default size, every dataset and row
    .venv/bin/python experiments/d2plan.py --datasets synthetic,musique --rows sft,splanrl
    .venv/bin/python experiments/d2plan.py --size smoke --datasets synthetic   # seconds of training (tests)
    .venv/bin/python experiments/d2plan.py --report-only   # rebuild the report from the results JSON
"""

from __future__ import annotations

import sys

from _paper_cli import main  # the shared runner beside this script (Python puts its folder on the path)

PAPER = "d2plan"


def run(argv: list[str] | None = None) -> int:
    """Run (or report) this paper's experiment with command-line ``argv``; returns the exit status."""
    return main(PAPER, __doc__, argv)


if __name__ == "__main__":
    sys.exit(run())
