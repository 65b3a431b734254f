"""Which trained stage moved the answers? Evaluate a warm start with some roles' adapters taken from another program.

A MAPGRPO row changes several roles at once (plan, then analysis, then synthesis). This builds the program that has
the warm start's adapters except ``--roles``, which come from ``--donor`` (a later program of the same kind, e.g. the
RL row's ``program``), evaluates it on the held-out questions of the seed-0 synthetic world (with ``--world-test``
questions in its test split, as ``bench_compile.py`` does) and prints the paired comparison against the warm start's
evaluation. The mixed program and its records go to ``OUT`` (``OUT/program``, ``OUT/eval``); a rerun resumes.

    .venv/bin/python benchmarks/opera_stage_mix.py runs/bench_rl_signal/synthetic/opera/sft/program \\
        RUN/program --roles plan --out runs/attrib/plan12 \\
        --against runs/bench_rl_signal/synthetic/opera/sft_eval --world-test 500
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def mix_program(base: Path, donor: Path, roles: list[str], out: Path) -> Path:
    """A copy of the saved program ``base`` at ``out`` whose ``roles`` adapters are ``donor``'s."""
    if out.exists():
        return out
    for role in roles:
        if not (donor / "adapters" / role).is_dir():
            have = sorted(p.name for p in (donor / "adapters").glob("*"))
            raise SystemExit(f"{donor} has no adapter for the role {role!r}; it has {have}")
    shutil.copytree(base, out)
    for role in roles:
        shutil.rmtree(out / "adapters" / role, ignore_errors=True)
        shutil.copytree(donor / "adapters" / role, out / "adapters" / role)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="the warm start's saved program (its folder with program.json)")
    parser.add_argument("donor", type=Path, help="the saved program whose adapters for --roles are taken")
    parser.add_argument("--roles", required=True, help="comma-separated roles taken from the donor (e.g. plan)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the mixed program and its evaluation")
    parser.add_argument("--against", type=Path, default=None, help="the warm start's evaluation, for the paired table")
    parser.add_argument("--program", default="opera", help="the registered program both are (default opera)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic world (default 0)")
    parser.add_argument("--world-test", type=int, default=500, help="its test split's size (default 500)")
    parser.add_argument("--test-questions", type=int, default=500, help="held-out questions evaluated (default 500)")
    parser.add_argument("--threads", type=int, default=24, help="evaluation threads (default 24)")
    parser.add_argument("--engine", default="auto", choices=("auto", "local", "vllm"), help="LM engine (default auto)")
    args = parser.parse_args()
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]

    from rolecall.data.synthetic import synthetic_world
    from rolecall.errors import ConfigError
    from rolecall.evaluation import evaluate
    from rolecall.evaluation.compare import compare_runs, format_comparison
    from rolecall.lm.engines import make_lm
    from rolecall.programs.registry import get_program_class
    from rolecall.retrievers.bm25 import BM25
    from rolecall.utils.logs import quiet_repeated_warnings

    quiet_repeated_warnings()
    mixed = mix_program(args.base, args.donor, roles, args.out / "program")
    world = synthetic_world(seed=args.seed, n_test=args.world_test)
    program = get_program_class(args.program).load(mixed, retriever=BM25(world.corpus), lm=make_lm(engine=args.engine))
    evaluate(program, world.test[: args.test_questions], num_threads=args.threads, output_dir=args.out / "eval",
             resume=True)  # fmt: skip
    if args.against is not None:
        try:
            print(format_comparison(compare_runs(args.against, args.out / "eval")), flush=True)
        except ConfigError as err:  # e.g. --test-questions differs from the warm start's evaluation
            raise SystemExit(f"opera_stage_mix: {err}") from None


if __name__ == "__main__":
    main()
