"""``rolecall compile``: build a registered program, train its role adapters with a weight optimizer (or a chain
of them), and save it for ``rolecall eval --load``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rolecall.cli_common import DEFAULT_DATA_PATHS, HelpFormatter, add_common, build_retriever, existing, split_of
from rolecall.cli_compile_checks import check_from, check_numbers, parse_roles
from rolecall.errors import ConfigError
from rolecall.lm.engines import add_engine_argument
from rolecall.programs.registry import get_program_class, option_names, parse_program_options, program_names

__all__ = [
    "APPLIES_TO",
    "OPTIMIZERS",
    "add_compile_parser",
    "add_training_arguments",
    "build_optimizers",
    "check_chain",
    "check_from",
    "cmd_compile",
    "opd_from_args",
    "sft_from_args",
    "splanrl_from_args",
    "start_program",
]

APPLIES_TO: dict[str, tuple[str, ...]] = {
    "mapgrpo": ("opera",),
    "grpo": ("opera", "search_r1"),
    "stride_ft": ("stride",),
    "multitask_sft": ("reap",),
    "splanrl": ("d2plan",),
    "opd": ("hierarchical_team",),
}
"""The optimizers written for one paper's program, and the programs each applies to (``sft`` applies to every
program with gold-path targets)."""

OPTIMIZERS: tuple[str, ...] = ("sft", *APPLIES_TO)
"""The names ``--optimizer`` takes."""


def add_compile_parser(sub: Any) -> None:
    """Adds ``rolecall compile`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "compile",
        help="train a program's role adapters with a weight optimizer and save the compiled program",
        description="Build a registered program on the embedded LM, train its role adapters on a training split with\n"
        "a weight optimizer, and save it (options, adapters, demo policy) to OUT, where `rolecall eval --load OUT`\n"
        "evaluates it. SFT trains each adapter on the program's own prompts along the gold path, demo-free.\n"
        "A comma-separated --optimizer is a chain: `sft,mapgrpo` warms OPERA's roles up with SFT, then runs MAPGRPO\n"
        "(`sft,grpo`: single-stage GRPO over all roles at once) within --rl-minutes; `grpo` on search_r1 trains its\n"
        "agent with Search-R1's plain GRPO (EM minus a format penalty, G rollouts per question). `stride_ft` tunes\n"
        "STRIDE from its own runs (Meta-Planner DPO, Supervisor / Extractor / Reasoner SFT; `sft,stride_ft` after a\n"
        "warm start); `multitask_sft` trains one adapter on REAP's merged Decomposer and Re-Planner data; `opd`\n"
        "trains hierarchical_team with MultiAgent-OPD (a cascaded Teacher with GRPO, then the team, its Searchers\n"
        "distilled from the Teacher; each stage within --rl-minutes).\n\n"
        "Writes OUT/program.json, OUT/adapters/<adapter>/, OUT/metrics.jsonl, OUT/loss.png (a chain: OUT/sft/...,\n"
        "OUT/mapgrpo/metrics.jsonl and OUT/rewards.png), a checkpoint after every step and OUT/compile_config.json.\n"
        "An OUT that holds a run is never overwritten: --resume continues it (with the same flags), --overwrite\n"
        "starts again. Ctrl-C stops after the running step and its checkpoint; --resume continues from there.",
        epilog="examples:\n"
        "  rolecall compile --program opera --optimizer sft --dataset synthetic --out runs/opera-sft\n"
        "  rolecall compile --program opera --optimizer sft --dataset synthetic --out runs/opera-sft --resume\n"
        "  rolecall eval --load runs/opera-sft --dataset synthetic --limit 100\n"
        "  rolecall compile --program opera --optimizer sft,mapgrpo --rl-minutes 15 --out runs/opera-sft-mapgrpo\n"
        "  rolecall compile --program stride --optimizer sft,stride_ft --num-plans 4 --out runs/stride-ft\n"
        "  rolecall compile --program reap --optimizer multitask_sft --out runs/reap-multitask\n"
        "  rolecall compile --program opera --dataset musique --out runs/opera-musique\n"
        "  rolecall eval --load runs/opera-musique --dataset musique --split test\n"
        "  rolecall compile --program opera --optimizer mapgrpo --config runs/tune/best_config.json --out runs/opera",
        formatter_class=HelpFormatter,
    )
    add_training_arguments(p)
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the compile in OUT (killed, interrupted or finished) from its last checkpoint; "
                       "the training flags must be the ones it was started with (OUT/compile_config.json)")  # fmt: skip
    again.add_argument("--overwrite", action="store_true",
                       help="delete everything in OUT (a compile run) once the model has loaded, and start again "
                       "(without it, or --resume, an OUT that holds a run is an error)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the compiled program is saved")
    add_common(p)
    p.set_defaults(func=cmd_compile)


ROLES_HELP = (
    "SFT: train only these roles' adapters; the others keep their demos (default: every role with a target; on "
    "HotpotQA, which has no gold decomposition, OPERA's only gold role is synthesis: --roles synthesis)"
)


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that say what to train and how: program, optimizer chain, data, model, training settings and
    ``--config`` (shared by ``rolecall compile`` and ``rolecall tune``)."""
    p.add_argument("--program", required=True, choices=program_names(), help="the program to train")
    p.add_argument(
        "--optimizer",
        default="sft",
        metavar="NAME[,NAME]",
        help="the weight optimizer, or a chain of them: sft, sft,mapgrpo, sft,grpo, mapgrpo (opera), grpo "
        "(opera, search_r1), stride_ft, "
        "sft,stride_ft (stride), multitask_sft (reap), opd (hierarchical_team), splanrl, sft,splanrl (d2plan) "
        "(default: %(default)s)",
    )
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="start from a program saved by `rolecall compile` (its adapters, demos and options) instead "
                   "of the untrained one: training continues from it, and --optimizer splanrl skips its own cold "
                   "start (the saved program is the warm start); -o cannot be given with it")  # fmt: skip
    p.add_argument("--rl-minutes", type=float, default=15.0, help="MAPGRPO / GRPO wall-clock budget (default: 15)")
    p.add_argument("--group-size", type=int, default=4, help="RL group size G, c_best included (default: 4)")
    p.add_argument("--num-plans", type=int, default=8, help="stride_ft: plans sampled per question (default: 8)")
    p.add_argument(
        "--dataset",
        default="synthetic",
        choices=("synthetic", "hotpotqa", "2wiki", "musique"),
        help="training data: the synthetic world's train split, or the 80%% train side of a real dev subset's "
        "hash split (`rolecall eval --split test` holds out the rest; default: %(default)s)",
    )
    p.add_argument("--data-path", type=Path, default=None, metavar="FILE",
                   help="the hotpotqa / 2wiki / musique file (default: its subset in ../shared/data)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic world (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="train on the first N training questions")
    p.add_argument("--epochs", type=float, default=2.0, help="passes over each adapter's samples (default: 2)")
    p.add_argument(
        "--max-steps",
        default=None,
        metavar="N|A=N,...",
        help="at most N optimizer steps per adapter, or per named adapter (plan=60,analysis=25)",
    )
    p.add_argument("--learning-rate", type=float, default=2e-3, help="AdamW learning rate (default: 2e-3)")
    p.add_argument(
        "--lr-schedule",
        default="linear",
        choices=("constant", "linear"),
        help="linear: the learning rate falls to 0 over each adapter's steps or the budget (default: %(default)s)",
    )
    p.add_argument("--batch-size", type=int, default=2, help="samples per forward pass (default: 2)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (default: 1)")
    p.add_argument("--roles", default=None, metavar="ROLE[,ROLE]", help=ROLES_HELP)
    p.add_argument("--budget-minutes", type=float, default=None, help="stop training after this much wall time")
    p.add_argument("--k", type=int, default=5, help="the program's top_k and the retriever's default k (default: 5)")
    p.add_argument("--threads", type=int, default=8, help="questions collected concurrently (default: 8)")
    p.add_argument("--model", default=None, help="LM name or local path (default: embedded SmolLM2-135M-Instruct)")
    add_engine_argument(p)
    p.add_argument("--served-url", default=None, metavar="URL",
                   help="generate rollouts on this OpenAI-compatible server (rolecall serve, vllm serve "
                   "--enable-lora) serving the same --model; training stays local, each step's adapter is loaded "
                   "into the server")  # fmt: skip
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="a program option")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="a JSON, YAML or TOML file of optimizer config fields (reward weights, ...; `rolecall tune` "
                   "writes best_config.json): the fields it sets override the defaults and the training flags above; "
                   "with a chain, they are grouped by optimizer ({\"sft\": {...}, \"mapgrpo\": {...}})")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def cmd_compile(args: argparse.Namespace) -> int:
    """``rolecall compile``: check the flags and OUT, build the program, train it with the optimizer, save it."""
    from rolecall.cli_compile_checks import check_max_steps_names
    from rolecall.cli_compile_run import (
        check_run_folder,
        compile_settings,
        print_curves,
        start_run_folder,
        steps_per_adapter,
        stop_model_thread,
    )
    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm.embedded import DEFAULT_LM
    from rolecall.lm.engines import make_lm
    from rolecall.optimizers.core import distributed
    from rolecall.optimizers.core.checkpoint import seed_everything

    chain, rl = check_chain(args)
    options = parse_program_options(args.program, args.option)
    optimizers = build_optimizers(args, chain, rl)
    check_max_steps_names(args, chain, options)
    settings = compile_settings(args, chain)
    resuming = check_run_folder(args.out, settings, resume=args.resume, overwrite=args.overwrite)
    if args.dataset == "synthetic":
        world = synthetic_world(seed=args.seed)
        trainset, corpus = list(world.train), list(world.corpus)
    else:
        from rolecall.data.corpus import build_corpus, load_dataset

        path = existing(args.data_path or DEFAULT_DATA_PATHS[args.dataset], "--data-path")
        trainset = split_of(load_dataset(args.dataset, path), "train", args.dataset)
        corpus = list(build_corpus(args.dataset, path))
    trainset = trainset[: args.limit] if args.limit else trainset
    # under `accelerate launch`: join the process group first, so each process loads the model onto its own GPU
    distributed.setup()
    if distributed.is_main_process():
        for line in resuming:
            print(line)
    if args.served_url:
        from rolecall.lm.served import ServedLM

        lm = ServedLM(args.served_url, args.model or DEFAULT_LM)
    else:
        lm = make_lm(args.model, engine=args.engine)
    if "top_k" not in options and "top_k" in option_names(get_program_class(args.program)):
        options["top_k"] = args.k
    # the new adapters' LoRA A matrices are drawn from torch's RNG: seeded, two compiles of the same settings train
    # the same weights (and a killed run's resumed steps can be checked against an uninterrupted one)
    seed_everything(args.seed)
    program = start_program(args, build_retriever("bm25", corpus, args.k), lm, options)
    if distributed.is_main_process():  # the model loaded: only now is an overwritten run deleted
        start_run_folder(args.out, settings, overwrite=args.overwrite)
    distributed.barrier()
    started = time.perf_counter()
    try:
        program.compile(optimizer=optimizers if len(optimizers) > 1 else optimizers[0], trainset=trainset)
    except KeyboardInterrupt:
        stop_model_thread(lm)
        raise
    if not distributed.is_main_process():  # the adapters are identical on every process: the main one saves
        return 0
    program.save(args.out)
    minutes = (time.perf_counter() - started) / 60
    what = f"{len(trainset)} {args.dataset} questions"
    print(f"{args.program} compiled with {','.join(chain)} on {what} in {minutes:.1f} min")
    for name, optimizer in zip(chain, optimizers, strict=True):
        print(f"{name} optimizer steps per adapter: {steps_per_adapter(optimizer)}")
        for adapter in getattr(optimizer, "untrained", []):
            reason = optimizer.stopped.get(adapter, "no step planned")
            print(f"{adapter}: 0 steps ({reason}); it keeps its demos")
    print(f"saved: {args.out} (evaluate with: rolecall eval --load {args.out})")
    print_curves(args, chain, rl, optimizers)
    return 0


def check_chain(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """``--optimizer``'s chain (``["sft", "mapgrpo"]``) and its RL part (``["mapgrpo"]``), checked against
    ``--program`` and the numeric flags before anything loads.

    Raises:
        ConfigError: an unknown or misordered chain, an optimizer that does not apply to the program, or a bad flag.
    """
    from rolecall.optimizers.sft import GOLD_BUILDERS

    chain = [o.strip().lower() for o in args.optimizer.split(",") if o.strip()]
    if not chain or any(o not in OPTIMIZERS for o in chain) or len(set(chain)) != len(chain):
        raise ConfigError(
            f"--optimizer takes {', '.join(OPTIMIZERS)}, or a chain such as sft,mapgrpo; got {args.optimizer!r}"
        )
    if "sft" in chain and chain[0] != "sft":
        raise ConfigError(f"--optimizer {args.optimizer}: sft is the warm start, so it comes first (sft,mapgrpo)")
    rl = [o for o in chain if o != "sft"]
    if len(rl) > 1:
        raise ConfigError(f"--optimizer {args.optimizer}: pick one of {', '.join(APPLIES_TO)} (after sft)")
    if rl and args.program not in APPLIES_TO[rl[0]]:
        raise ConfigError(f"--optimizer {rl[0]} applies to {', '.join(APPLIES_TO[rl[0]])}, not {args.program!r}")
    if rl == ["multitask_sft"] and chain != rl:
        raise ConfigError("--optimizer multitask_sft is itself SFT (REAP's merged planning tasks): give it alone")
    if "sft" in chain and get_program_class(args.program) not in GOLD_BUILDERS:
        names = ", ".join(n for n in program_names() if get_program_class(n) in GOLD_BUILDERS)
        raise ConfigError(f"--optimizer sft has gold-path targets for {names}; {args.program!r} has none yet")
    for name in ("k", "threads", "group_size", "num_plans"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    check_numbers(args)
    check_from(args)
    return chain, rl


def start_program(args: argparse.Namespace, retriever: Any, lm: Any, options: dict[str, Any]) -> Any:
    """The program training starts from: the one saved in ``--from DIR`` (its adapters loaded into ``lm``), else
    ``--program`` built with ``options``."""
    from rolecall.programs.registry import build_program

    folder = getattr(args, "from_dir", None)
    if folder is not None:
        return get_program_class(args.program).load(folder, retriever=retriever, lm=lm)
    return build_program(args.program, retriever, lm, **options)


def build_optimizers(args: argparse.Namespace, chain: list[str], rl: list[str]) -> list[Any]:
    """The optimizers of the chain :func:`check_chain` returned, built from the flags and writing under ``args.out``,
    then with the fields of ``--config`` (when given) over them. No model loads.

    Raises:
        ConfigError: a flag's value is invalid, or the config file is unreadable or names an unknown field (the
            message lists the valid ones).
    """
    optimizers: list[Any] = []
    if "sft" in chain:
        optimizers.append(sft_from_args(args, args.out / "sft" if rl else args.out, resume=args.resume,
                                        show_progress=not args.no_progress))  # fmt: skip
    if rl == ["grpo"] and args.program == "search_r1":  # Search-R1's agent with plain GRPO over whole rollouts
        from rolecall.optimizers import SearchR1GRPO

        optimizers.append(SearchR1GRPO(group_size=args.group_size, time_budget_s=args.rl_minutes * 60,
                                       output_dir=args.out / "grpo", resume=args.resume, num_threads=args.threads,
                                       seed=args.seed, show_progress=not args.no_progress))  # fmt: skip
    elif rl in (["mapgrpo"], ["grpo"]):
        from rolecall.optimizers import MAPGRPO, JointGRPO, MAPGRPOConfig

        config = MAPGRPOConfig(group_size=args.group_size, time_budget_s=args.rl_minutes * 60,
                               output_dir=args.out / rl[0], resume=args.resume, num_threads=args.threads,
                               seed=args.seed, show_progress=not args.no_progress)  # fmt: skip
        optimizers.append(MAPGRPO(config) if rl[0] == "mapgrpo" else JointGRPO(config))
    elif rl == ["stride_ft"]:
        from rolecall.optimizers import STRIDEFT

        optimizers.append(STRIDEFT(num_plans=args.num_plans, time_budget_minutes=args.budget_minutes,
                                   num_threads=args.threads, output_dir=str(args.out / "stride_ft"),
                                   resume=args.resume, seed=args.seed, show_progress=not args.no_progress))  # fmt: skip
    elif rl == ["multitask_sft"]:
        from rolecall.optimizers.multitask_sft import MultiTaskSFT

        optimizers.append(sft_from_args(args, args.out, resume=args.resume, show_progress=not args.no_progress,
                                        cls=MultiTaskSFT))  # fmt: skip
    elif rl == ["splanrl"]:
        warm = "sft" in chain or getattr(args, "from_dir", None) is not None
        optimizers.append(splanrl_from_args(args, cold_start="none" if warm else "self"))
    elif rl == ["opd"]:
        optimizers.append(opd_from_args(args))
    if getattr(args, "config", None) is not None:
        from rolecall.tuning.config_file import apply_config_file

        optimizers = list(apply_config_file(args.config, dict(zip(chain, optimizers, strict=True))).values())
    return optimizers


def sft_from_args(
    args: argparse.Namespace, output_dir: Path, *, resume: bool = False, show_progress: bool = True, cls: Any = None
) -> Any:
    """The SFT optimizer that ``rolecall compile``'s training flags describe (``--epochs``, ``--max-steps``,
    ``--learning-rate``, ``--lr-schedule``, ``--batch-size``, ``--grad-accum``, ``--roles``, ``--budget-minutes``,
    ``--threads``),
    checked before any model loads; ``benchmarks/bench_compile.py`` shares the flags. ``cls`` is an SFT subclass to
    build instead (``MultiTaskSFT``).

    Raises:
        ConfigError: a flag's value is invalid (the message names it).
    """
    from rolecall.optimizers.sft import SFT, parse_max_steps

    roles = parse_roles(getattr(args, "roles", None))
    return (cls or SFT)(
        **({"roles": roles} if roles else {}),  # unset: the optimizer's own default (MultiTaskSFT's planning roles)
        epochs=args.epochs,
        max_steps=parse_max_steps(args.max_steps),
        resume=resume,
        learning_rate=args.learning_rate,
        lr_schedule=args.lr_schedule,
        micro_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        time_budget_minutes=args.budget_minutes,
        num_threads=args.threads,
        output_dir=str(output_dir),
        show_progress=show_progress,
    )


def splanrl_from_args(args: argparse.Namespace, *, cold_start: str) -> Any:
    """D2Plan's SPlanRL from ``rolecall compile``'s flags, checked before any model loads: GRPO on the Reasoner with
    G = ``--group-size`` rollouts within ``--rl-minutes``, written to OUT/splanrl. ``cold_start="self"`` (``--optimizer
    splanrl``) runs the paper's cold start first (SFT on the program's own runs with an exactly right answer and a
    search; ``--epochs``, ``--max-steps N``, ``--learning-rate``, ``--budget-minutes``, to OUT/splanrl/cold_start);
    after ``sft,`` the chain's gold-path SFT is the cold start (``cold_start="none"``).

    Raises:
        ConfigError: a flag's value is invalid (the message names it).
    """
    from rolecall.optimizers.sft import parse_max_steps
    from rolecall.optimizers.splanrl import SPlanRL

    max_steps = parse_max_steps(args.max_steps) if cold_start != "none" else None
    if isinstance(max_steps, dict):
        raise ConfigError(f"--optimizer splanrl's cold start takes --max-steps N (one cap); got {args.max_steps!r}")
    return SPlanRL(
        group_size=args.group_size,
        time_budget_minutes=args.rl_minutes,
        cold_start=cold_start,
        cold_start_epochs=args.epochs,
        cold_start_max_steps=max_steps,
        cold_start_learning_rate=args.learning_rate,
        cold_start_minutes=args.budget_minutes,
        num_threads=args.threads,
        seed=args.seed,
        output_dir=str(args.out / "splanrl"),
        resume=args.resume,
        show_progress=not args.no_progress,
    )


def opd_from_args(args: argparse.Namespace) -> Any:
    """MultiAgent-OPD from ``rolecall compile``'s flags, checked before any model loads: G = ``--group-size`` team
    rollouts per question; Stage I (the cascaded Teacher, to OUT/opd/teacher) and Stage II (the team, to OUT/opd)
    each within ``--rl-minutes`` and, with ``--max-steps N``, at most N steps.

    Raises:
        ConfigError: a flag's value is invalid (the message names it).
    """
    from rolecall.optimizers.opd import OPD
    from rolecall.optimizers.sft import parse_max_steps

    max_steps = parse_max_steps(args.max_steps)
    if isinstance(max_steps, dict):
        raise ConfigError(f"--optimizer opd takes --max-steps N (one cap per stage); got {args.max_steps!r}")
    steps = {} if max_steps is None else {"steps": max_steps, "teacher_steps": max_steps}
    return OPD(
        group_size=args.group_size,
        time_budget_minutes=args.rl_minutes,
        teacher_minutes=args.rl_minutes,
        num_threads=args.threads,
        seed=args.seed,
        output_dir=str(args.out / "opd"),
        resume=args.resume,
        show_progress=not args.no_progress,
        **steps,
    )
