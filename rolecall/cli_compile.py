"""``rolecall compile``: build a registered program, train its role adapters with a weight optimizer (or a chain
of them), and save it for ``rolecall eval --load``."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rolecall.cli_common import DEFAULT_DATA_PATHS, add_command, add_common, build_retriever, existing, split_of
from rolecall.cli_compile_checks import check_from, check_numbers
from rolecall.cli_fields import add_config_flags, with_flags
from rolecall.errors import ConfigError, RolecallError
from rolecall.lm.engines import add_engine_argument
from rolecall.optimizers.registry import (
    LiveMapping,
    OptimizerEntry,
    config_class,
    load_target,
    optimizer_entry,
    optimizer_names,
)
from rolecall.programs.registry import get_program_class, get_system, gold_programs, program_names

logger = logging.getLogger("rolecall.cli")

__all__ = [
    "APPLIES_TO",
    "OPTIMIZERS",
    "add_compile_parser",
    "add_training_arguments",
    "build_optimizers",
    "chain_configs",
    "check_chain",
    "check_from",
    "cmd_compile",
    "start_program",
]


def _applies_to() -> dict[str, tuple[str, ...]]:
    """``--optimizer`` name -> the programs it applies to, from the system registry (``sft`` is not in it: it applies
    to every program with gold-path targets)."""
    table: dict[str, list[str]] = {n: [] for n in optimizer_names() if n != "sft"}
    for program in program_names():
        for name in get_system(program).optimizer_names():
            if name != "sft":
                table.setdefault(name, []).append(program)
    return {name: tuple(programs) for name, programs in table.items() if programs}


APPLIES_TO: Mapping[str, tuple[str, ...]] = LiveMapping(_applies_to)
"""The optimizers written for a paper's program, and the programs each applies to (``sft`` applies to every program
with gold-path targets); from the registries."""


class _Names(Sequence[str]):
    """``sft`` and the names of :data:`APPLIES_TO`, read from the registries on every access."""

    def _names(self) -> list[str]:
        return ["sft", *APPLIES_TO]

    def __getitem__(self, index: Any) -> Any:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())


OPTIMIZERS: Sequence[str] = _Names()
"""The names ``--optimizer`` takes."""


_COMPILE_HELP = "train a program's role adapters with a weight optimizer and save the compiled program"
_COMPILE_DESCRIPTION = (
    "Build a registered program on the embedded LM, train its role adapters on a training split with\n"
    "a weight optimizer, and save it (options, adapters, demo policy) to OUT, where `rolecall eval --load OUT`\n"
    "evaluates it. SFT trains each adapter on the program's own prompts along the gold path, demo-free.\n"
    "A comma-separated --optimizer is a chain: `sft,mapgrpo` warms OPERA's roles up with SFT, then runs MAPGRPO\n"
    "(`sft,grpo`: single-stage GRPO over all roles at once); `grpo` on search_r1 trains its agent with\n"
    "Search-R1's plain GRPO. `rolecall programs` lists which optimizer applies to which program.\n\n"
    "Every setting of the optimizer is a flag named after its config field (`--group-size 4`, `--steps\n"
    "plan=4,analysis=8`, `--plan-weights logic=0.2`), checked before the model loads; a chain's warm start\n"
    "takes its own with its name in front (`--sft.epochs 1`). `rolecall compile --optimizer NAME --help`\n"
    "lists NAME's settings with their defaults. Training runs the configured steps; a --time-budget-minutes\n"
    "is a ceiling, reported when hit.\n\n"
    "Writes OUT/program.json, OUT/adapters/<adapter>/, OUT/metrics.jsonl, OUT/loss.png (a chain: OUT/sft/...,\n"
    "OUT/mapgrpo/metrics.jsonl and OUT/rewards.png), a checkpoint after every step and OUT/compile_config.json.\n"
    "An OUT that holds a run is never overwritten: --resume continues it (with the same flags), --overwrite\n"
    "starts again. Ctrl-C stops after the running step and its checkpoint; --resume continues from there."
)
_COMPILE_EPILOG = (
    "examples:\n"
    "  rolecall compile --program opera --optimizer sft --dataset synthetic --out runs/opera-sft\n"
    "  rolecall compile --program opera --optimizer sft --dataset synthetic --out runs/opera-sft --resume\n"
    "  rolecall eval --load runs/opera-sft --dataset synthetic --limit 100\n"
    "  rolecall compile --program opera --optimizer sft,mapgrpo --sft.max-steps 20 --steps plan=4,analysis=8 \\\n"
    "      --out runs/opera-sft-mapgrpo\n"
    "  rolecall compile --program opera --optimizer mapgrpo --help      # MAPGRPO's settings\n"
    "  rolecall compile --program stride --optimizer sft,stride_ft --num-plans 4 --out runs/stride-ft\n"
    "  rolecall compile --program reap --optimizer multitask_sft --out runs/reap-multitask\n"
    "  rolecall compile --program opera --dataset musique --out runs/opera-musique\n"
    "  rolecall compile --program opera --optimizer mapgrpo --config runs/tune/best_config.json --out runs/opera"
)


def add_compile_parser(sub: Any, argv: Sequence[str] | None = None) -> None:
    """Adds ``rolecall compile`` to the subcommands ``sub``; ``argv`` (the command line) decides which optimizers'
    settings ``--help`` lists (None: all of them)."""
    p = add_command(sub, "compile", _COMPILE_HELP, _COMPILE_DESCRIPTION, _COMPILE_EPILOG)
    add_training_arguments(p, argv)
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


def add_training_arguments(p: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> None:
    """The flags that say what to train and how: program, optimizer chain, data, model, ``--config`` and one flag per
    optimizer setting (generated from the registered optimizers' config fields; ``argv`` decides which ones
    ``--help`` lists); shared by ``rolecall compile`` and ``rolecall tune``."""
    p.add_argument("--program", required=True, choices=program_names(), help="the program to train")
    p.add_argument(
        "--optimizer",
        default="sft",
        metavar="NAME[,NAME]",
        help=f"the weight optimizer, or sft then one of them (a chain: sft,mapgrpo): {', '.join(OPTIMIZERS)}; "
        "`rolecall programs` lists which applies to which program (default: %(default)s)",
    )
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="start from a program saved by `rolecall compile` (its adapters, demos and options) instead "
                   "of the untrained one: training continues from it, and --optimizer splanrl skips its own cold "
                   "start (the saved program is the warm start); -o cannot be given with it")  # fmt: skip
    p.add_argument(
        "--dataset",
        default="synthetic",
        choices=("synthetic", "hotpotqa", "2wiki", "musique"),
        help="training data: the synthetic world's train split, or the 80%% train side of a real dev subset's "
        "hash split (`rolecall eval --split test` holds out the rest; default: %(default)s)",
    )
    p.add_argument("--data-path", type=Path, default=None, metavar="FILE",
                   help="the hotpotqa / 2wiki / musique file (default: its subset in ../shared/data)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the synthetic world and of each optimizer (default: %(default)s)")  # fmt: skip
    p.add_argument("--limit", type=int, default=None, metavar="N", help="train on the first N training questions")
    p.add_argument("--k", type=int, default=5, help="the program's top_k and the retriever's default k (default: 5)")
    p.add_argument("--model", default=None, help="LM name or local path (default: embedded SmolLM2-135M-Instruct)")
    add_engine_argument(p)
    p.add_argument("--served-url", default=None, metavar="URL",
                   help="generate rollouts on this OpenAI-compatible server (rolecall serve, vllm serve "
                   "--enable-lora) serving the same --model; training stays local, each step's adapter is loaded "
                   "into the server")  # fmt: skip
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="a program option")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="a JSON, YAML or TOML file of optimizer config fields (reward weights, ...; `rolecall tune` "
                   "writes best_config.json): the fields it sets override the defaults and the setting flags; "
                   "with a chain, they are grouped by optimizer ({\"sft\": {...}, \"mapgrpo\": {...}})")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    configs = [(n, config_class(n), optimizer_entry(n).kind == "warm_start") for n in optimizer_names()]
    add_config_flags(p, configs, shown=None if argv is None else chain_configs(argv))


def chain_configs(argv: Sequence[str]) -> list[tuple[str, type]]:
    """The optimizer chain a command line names (``--program``, ``--optimizer``) as ``[(name, config class)]``, for
    ``--help``; empty when they do not name a valid chain (the command's own check then says why)."""
    scan = argparse.ArgumentParser(add_help=False)
    scan.add_argument("--program", default=None)
    scan.add_argument("--optimizer", default="sft")
    known, _ = scan.parse_known_args(list(argv))
    try:
        links = resolve_chain(known.program, known.optimizer)
    except RolecallError:
        return []
    return [(name, config_class(entry.name)) for name, entry in links]


def resolve_chain(program: str | None, text: str) -> list[tuple[str, OptimizerEntry]]:
    """``--optimizer``'s chain as ``[(name as given, registered optimizer)]``, checked: known names, the warm start
    first, at most one optimizer after it, each applying to ``program`` (None: not checked; a name a program
    redirects, ``grpo`` on search_r1, resolves only with it).

    Raises:
        ConfigError: an unknown or misordered chain, or an optimizer that does not apply to the program (the message
            names the programs it applies to).
    """
    chain = [o.strip().lower() for o in text.split(",") if o.strip()]
    known = {*OPTIMIZERS, *optimizer_names()}
    if not chain or any(o not in known for o in chain) or len(set(chain)) != len(chain):
        raise ConfigError(f"--optimizer takes {', '.join(OPTIMIZERS)}, or a chain such as sft,mapgrpo; got {text!r}")
    system = get_system(program) if program is not None else None
    links = []
    for name in chain:
        resolved = system.resolve(name) if system is not None else name if name in optimizer_names() else None
        if system is not None and resolved is None:
            if name == "sft":
                names = ", ".join(gold_programs())
                raise ConfigError(f"--optimizer sft has gold-path targets for {names}; {program!r} has none yet")
            raise ConfigError(f"--optimizer {name} applies to {', '.join(APPLIES_TO.get(name, ()))}, not {program!r}")
        links.append((name, optimizer_entry(resolved or name)))
    kinds = [entry.kind for _, entry in links]
    if "warm_start" in kinds[1:]:
        raise ConfigError(f"--optimizer {text}: {links[kinds.index('warm_start', 1)][0]} is the warm start, so it "
                          "comes first (sft,mapgrpo)")  # fmt: skip
    if "alone" in kinds and len(links) > 1:
        alone, entry = links[kinds.index("alone")]
        raise ConfigError(f"--optimizer {alone} is itself SFT ({entry.summary}): give it alone")
    trainers = [name for name, entry in links if entry.kind != "warm_start"]
    if len(trainers) > 1 or len(links) > 2:
        choices = [n for n in system.optimizer_names() if n != "sft"] if system is not None else list(APPLIES_TO)
        raise ConfigError(f"--optimizer {text}: pick one of {', '.join(choices)} (after sft)")
    return links


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
    from rolecall.programs.registry import option_names, parse_program_options

    chain, rl = check_chain(args)
    options = parse_program_options(args.program, args.option)
    optimizers = build_optimizers(args, chain, rl)
    check_max_steps_names(args, chain, optimizers, options)
    settings = compile_settings(args, chain, optimizers)
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
    """``--optimizer``'s chain (``["sft", "mapgrpo"]``) and the part after the warm start (``["mapgrpo"]``), checked
    against ``--program`` and the flags before anything loads.

    Raises:
        ConfigError: an unknown or misordered chain, an optimizer that does not apply to the program, or a bad flag.
    """
    links = resolve_chain(args.program, args.optimizer)
    check_numbers(args)
    check_from(args)
    chain = [name for name, _ in links]
    return chain, [name for name, entry in links if entry.kind != "warm_start"]


def start_program(args: argparse.Namespace, retriever: Any, lm: Any, options: dict[str, Any]) -> Any:
    """The program training starts from: the one saved in ``--from DIR`` (its adapters loaded into ``lm``), else
    ``--program`` built with ``options``."""
    from rolecall.programs.registry import build_program

    folder = getattr(args, "from_dir", None)
    if folder is not None:
        return get_program_class(args.program).load(folder, retriever=retriever, lm=lm)
    return build_program(args.program, retriever, lm, **options)


def build_optimizers(args: argparse.Namespace, chain: list[str], rl: list[str]) -> list[Any]:
    """The optimizers of the chain :func:`check_chain` returned, built from the registry: each config from its
    defaults, the run flags (``--out``, ``--seed``, ``--resume``, ``--no-progress``), the setting flags and, over
    them, the fields of ``--config``; then validated. No model loads.

    A chain's optimizers write to ``OUT/<name>``; a warm start or a lone SFT-style optimizer alone writes to OUT.

    Raises:
        ConfigError: a setting's value is invalid (one line naming its flag, the value and what is allowed), or the
            config file is unreadable or names an unknown field (the message lists the valid ones).
    """
    from rolecall.tuning.config_file import apply_fields, config_sections, load_config_file

    links = resolve_chain(args.program, ",".join(chain))
    out = getattr(args, "out", None) or Path(".")
    sections = config_sections(load_config_file(args.config), chain) if getattr(args, "config", None) else {}
    warm = getattr(args, "from_dir", None) is not None
    optimizers = []
    for position, (name, entry) in enumerate(links):
        cls = config_class(entry.name)
        folder = out if len(links) == 1 and entry.kind != "trainer" else out / name
        run = {"output_dir": str(folder), "seed": args.seed, "resume": bool(getattr(args, "resume", False)),
               "show_progress": not args.no_progress, **(entry.after_warm_start if warm else {})}  # fmt: skip
        config = cls.from_kwargs(name, run)
        config = with_flags(config, args, name, last=position == len(links) - 1)
        if name in sections:
            logger.info("config file %s: %s fields %s", args.config, name, sorted(sections[name]))
            config = apply_fields(config, sections[name])
        optimizers.append(load_target(entry.optimizer, f"optimizer {entry.name!r}")(config))
        warm = warm or entry.kind == "warm_start"
    return optimizers
