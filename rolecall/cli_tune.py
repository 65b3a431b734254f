"""``rolecall tune``: search a weight optimizer's config fields (reward weights, learning rates, ...) against the dev
score with optuna, pruning hopeless trials, in an SQLite study that a rerun resumes; writes the best trial's config
for ``rolecall compile --config`` and the study's plots (:mod:`rolecall.tuning`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rolecall.cli_common import DEFAULT_DATA_PATHS, add_command, add_common, build_retriever, existing, split_of
from rolecall.cli_compile import add_training_arguments, build_optimizers, check_chain, start_program
from rolecall.errors import ConfigError
from rolecall.programs.registry import get_program_class, option_names, parse_program_options

__all__ = ["add_tune_parser", "cmd_tune"]

DEV_SALT = "rolecall-tune-dev"
"""Salt of the hash split that takes a real dataset's dev questions from its train side (the test side stays out)."""


_TUNE_HELP = "search an optimizer's config fields (reward weights, ...) against dev EM with optuna; resumable"
_TUNE_DESCRIPTION = (
    "Search the config fields of `rolecall compile`'s optimizer (or chain) against the dev score:\n"
    "each trial compiles the program on the training questions with the trial's fields and evaluates it on dev\n"
    "questions (the synthetic world's dev split; for a real dataset, 20% of its train side). Reward weights\n"
    "that sum to 1 are a --simplex group, sampled on the simplex. TPE by default; --sampler grid is the papers'\n"
    "grid search (simplex groups on a --grid-step grid). During training the optimizer reports the dev score\n"
    "after each stage (and every --eval-every steps) and the pruner stops hopeless trials.\n\n"
    "The study lives in OUT/study.db (SQLite): rerunning the same command resumes it, keeping every finished\n"
    "trial (after a SIGKILL too; a trial that was running is retried). --trials counts the study's finished\n"
    "trials, earlier runs' included.\n\n"
    "Writes OUT/best_config.json (for `rolecall compile --config`), OUT/trials.json, OUT/plots/*.png\n"
    "(history, importances, slice, intermediate) and OUT/trials/<n>/ (each trial's training output).\n"
    "Trial 0 of a new TPE or random study runs the optimizer's defaults (the paper's values; --no-defaults-trial\n"
    "skips it), and the summary compares the best trial with it.\n\n"
    "Search flags: --param NAME=float:LOW:HIGH[:log][:step=S] | int:LOW:HIGH[:log][:step=S] | cat:A,B,C and\n"
    "--simplex GROUP=F1,F2,...[@TOTAL] (fields GROUP.F1, ...) or F1,F2,... (top-level fields). With a chain,\n"
    "prefix the fields with the optimizer: --simplex mapgrpo.rewrite_weights=retrieval,format."
)
_TUNE_EPILOG = (
    "examples:\n"
    "  rolecall tune --program single_step_rag --optimizer sft --limit 40 --dev-limit 20 --trials 12 \\\n"
    "      --param learning_rate=float:1e-4:1e-2:log --param epochs=float:0.5:3 --out runs/tune-sft\n"
    "  rolecall tune --program opera --optimizer mapgrpo --time-budget-minutes 10 --trials 20 --eval-every 2 \\\n"
    "      --simplex plan_weights=logic,feasibility,execution,efficiency,placeholder --out runs/tune-opera\n"
    "  rolecall tune --program opera --optimizer mapgrpo --sampler grid --grid-step 0.1 \\\n"
    "      --simplex rewrite_weights=retrieval,format --out runs/grid-opera\n"
    "  rolecall compile --program opera --optimizer mapgrpo --config runs/tune-opera/best_config.json \\\n"
    "      --out runs/opera-tuned"
)


def add_tune_parser(sub: Any, argv: Sequence[str] | None = None) -> None:
    """Adds ``rolecall tune`` to the subcommands ``sub``; ``argv`` decides which optimizers' settings ``--help`` lists
    (as for ``rolecall compile``)."""
    p = add_command(sub, "tune", _TUNE_HELP, _TUNE_DESCRIPTION, _TUNE_EPILOG)
    add_training_arguments(p, argv)
    search = p.add_argument_group("search")
    search.add_argument("--param", action="append", default=[], metavar="NAME=SPEC",
                        help="a searched config field (see above); repeatable")  # fmt: skip
    search.add_argument("--simplex", action="append", default=[], metavar="[GROUP=]F1,F2,...[@TOTAL]",
                        help="config fields whose weights sum to TOTAL (default 1), sampled on the simplex; "
                        "repeatable")  # fmt: skip
    search.add_argument("--sampler", default="tpe", choices=("tpe", "grid", "random"),
                        help="tpe (default), grid (every grid point; float params need step=) or random")  # fmt: skip
    search.add_argument("--grid-step", type=float, default=0.1,
                        help="--sampler grid: spacing of the simplex grid (default: %(default)s)")  # fmt: skip
    search.add_argument("--trials", type=int, default=None, metavar="N",
                        help="finished trials the study should have (default: 20; grid: the whole grid)")  # fmt: skip
    search.add_argument("--timeout-minutes", type=float, default=None, help="stop starting trials after this long")
    search.add_argument("--defaults-trial", action=argparse.BooleanOptionalAction, default=None,
                        help="a new study's first trial runs the optimizer's defaults (the paper's values), so the "
                        "best trial is compared with them (default: on for tpe and random, off for grid)")  # fmt: skip
    prune = p.add_argument_group("scoring and pruning")
    prune.add_argument("--dev-limit", type=int, default=50, metavar="N",
                       help="dev questions each trial is scored on (default: %(default)s)")  # fmt: skip
    prune.add_argument("--metric", default="em", choices=("em", "f1", "cover_em"),
                       help="the dev score (default: %(default)s)")  # fmt: skip
    prune.add_argument("--eval-every", type=int, default=None, metavar="N",
                       help="report the dev score every N optimizer steps too (default: after each stage)")  # fmt: skip
    prune.add_argument("--pruner", default="median", choices=("median", "threshold", "none"),
                       help="median: below the median of earlier trials at the same step; threshold: below "
                       "--prune-below (default: %(default)s)")  # fmt: skip
    prune.add_argument("--prune-below", type=float, default=None, metavar="X",
                       help="--pruner threshold: stop a trial whose dev score falls below X")  # fmt: skip
    prune.add_argument("--warmup-steps", type=int, default=0, metavar="N",
                       help="no pruning before optimizer step N (default: %(default)s)")  # fmt: skip
    prune.add_argument("--startup-trials", type=int, default=2, metavar="N",
                       help="--pruner median: no pruning until N trials finished (default: %(default)s)")  # fmt: skip
    study = p.add_argument_group("study")
    study.add_argument("--out", type=Path, required=True, metavar="DIR", help="the study's folder")
    study.add_argument("--storage", type=Path, default=None, metavar="FILE",
                       help="the SQLite file of the study (default: OUT/study.db)")  # fmt: skip
    study.add_argument("--study-name", default="rolecall-tune",
                       help="the study's name in the file (default: %(default)s)")  # fmt: skip
    study.add_argument("--heartbeat-seconds", type=int, default=10, metavar="S",
                       help="a running trial's heartbeat; one silent for 2S seconds is taken for dead and retried "
                       "(default: %(default)s)")  # fmt: skip
    study.add_argument("--no-plots", action="store_true", help="do not draw OUT/plots/*.png")
    add_common(p)
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    """``rolecall tune``: check everything, load the data and the model, run the study, print its results."""
    import optuna

    from rolecall.tuning import (
        Objective,
        SearchSpace,
        config_sections,
        load_config_file,
        make_pruner,
        make_sampler,
        open_study,
        parse_param,
        parse_simplex,
        tune,
    )
    from rolecall.tuning.config_file import optimizer_config

    if not args.verbose:  # optuna logs every trial at INFO; this command prints its own summary
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SearchSpace(params=tuple(parse_param(s) for s in args.param),
                        simplexes=tuple(parse_simplex(s) for s in args.simplex), grid_step=args.grid_step)  # fmt: skip
    _check_args(args)
    chain, rl = check_chain(args)
    options = parse_program_options(args.program, args.option)
    base = config_sections(load_config_file(args.config), chain) if args.config is not None else {}
    args.resume = False  # a trial never resumes another trial's checkpoints
    templates = dict(zip(chain, build_optimizers(args, chain, rl), strict=True))
    sampler = make_sampler(space, args.sampler, seed=args.seed)
    pruner = make_pruner(args.pruner, lower=args.prune_below, warmup_steps=args.warmup_steps,
                         startup_trials=args.startup_trials)  # fmt: skip
    n_trials = args.trials if args.trials is not None else space.grid_size() if args.sampler == "grid" else 20
    trainset, devset, corpus = _load_data(args)
    objective = Objective(program_factory=_program_factory(args, corpus, options), optimizers=templates, space=space,
                          trainset=trainset, devset=devset, base_config=base, grid=args.sampler == "grid",
                          eval_every=args.eval_every, metric=args.metric, output_dir=args.out,
                          num_threads=optimizer_config(templates[chain[-1]]).num_threads,
                          reset=args.from_dir is None)  # fmt: skip
    defaults = _defaults_params(args, objective, space)
    storage = args.storage or args.out / "study.db"
    study = open_study(storage, study_name=args.study_name, sampler=sampler, pruner=pruner,
                       heartbeat_interval=args.heartbeat_seconds)  # fmt: skip
    _check_same_search(study, args, chain)
    print(f"rolecall tune: {args.program} with {','.join(chain)}; {len(trainset)} training and {len(devset)} dev "
          f"questions; {args.sampler} over {', '.join(space.names)}")  # fmt: skip
    print(f"study {args.study_name!r} in {storage}")
    try:
        result = tune(objective, study, n_trials=n_trials, output_dir=args.out, plots=not args.no_plots,
                      timeout_s=args.timeout_minutes * 60 if args.timeout_minutes else None,
                      defaults=defaults)  # fmt: skip
    except KeyboardInterrupt:
        print(f"interrupted; finished trials are kept in {storage}: rerun the same command to resume")
        return 130
    _print_results(result, args, storage)
    return 0


def _check_args(args: argparse.Namespace) -> None:
    for name in ("dev_limit", "heartbeat_seconds"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.trials is not None and args.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {args.trials}")
    if args.eval_every is not None and args.eval_every < 1:
        raise ConfigError(f"--eval-every must be >= 1, got {args.eval_every}")
    if args.timeout_minutes is not None and not args.timeout_minutes > 0:
        raise ConfigError(f"--timeout-minutes must be > 0, got {args.timeout_minutes}")
    if args.prune_below is not None and args.pruner != "threshold":
        raise ConfigError("--prune-below is the threshold of --pruner threshold; add --pruner threshold")


def _defaults_params(args: argparse.Namespace, objective: Any, space: Any) -> dict[str, Any] | None:
    """The Optuna parameters of the defaults trial (None when ``--no-defaults-trial`` or a grid study)."""
    wanted = args.defaults_trial if args.defaults_trial is not None else args.sampler != "grid"
    if not wanted:
        return None
    if args.sampler == "grid":
        raise ConfigError("--defaults-trial: a grid study runs every grid point, the defaults' among them when they "
                          "lie on the grid; drop --defaults-trial or use --sampler tpe")  # fmt: skip
    values = objective.default_values()
    try:
        return space.trial_params(values)
    except ConfigError as err:
        raise ConfigError(f"the defaults trial cannot run: {err}. Pass --no-defaults-trial to search without "
                          "it") from err  # fmt: skip


def _check_same_search(study: Any, args: argparse.Namespace, chain: list[str]) -> None:
    """Records what the study searches when it is new; a resumed study must search the same thing."""
    settings = {"program": args.program, "optimizer": ",".join(chain), "dataset": args.dataset,
                "param": sorted(args.param), "simplex": sorted(args.simplex), "sampler": args.sampler,
                "grid_step": args.grid_step if args.sampler == "grid" else None, "metric": args.metric,
                "config": str(args.config) if args.config is not None else None,
                "from": str(args.from_dir) if args.from_dir is not None else None}  # fmt: skip
    saved = study.user_attrs.get("settings")
    if saved is None:
        study.set_user_attr("settings", settings)
        return
    changed = sorted(k for k in settings if saved.get(k) != settings[k])
    if changed:
        was = ", ".join(f"{k}={saved.get(k)!r}" for k in changed)
        raise ConfigError(f"study {study.study_name!r} was run with {was}; resume it with the same flags, or start "
                          "another study with --study-name or --out")  # fmt: skip


def _load_data(args: argparse.Namespace) -> tuple[list[Any], list[Any], list[Any]]:
    """Training questions (``--limit``), dev questions (``--dev-limit``) and the corpus."""
    if args.dataset == "synthetic":
        from rolecall.data.synthetic import synthetic_world

        world = synthetic_world(seed=args.seed)
        trainset, devset, corpus = list(world.train), list(world.dev), list(world.corpus)
    else:
        from rolecall.data import hash_split
        from rolecall.data.corpus import build_corpus, load_dataset

        path = existing(args.data_path or DEFAULT_DATA_PATHS[args.dataset], "--data-path")
        train_side = split_of(load_dataset(args.dataset, path), "train", args.dataset)
        trainset, devset = hash_split(train_side, fraction=0.8, salt=DEV_SALT)
        corpus = list(build_corpus(args.dataset, path))
    trainset = trainset[: args.limit] if args.limit else trainset
    devset = devset[: args.dev_limit]
    if not trainset or not devset:
        raise ConfigError(f"{args.dataset}: {len(trainset)} training and {len(devset)} dev questions; need both")
    return trainset, devset, corpus


def _program_factory(args: argparse.Namespace, corpus: list[Any], options: dict[str, Any]) -> Any:
    """A factory of fresh programs for the trials; the LM and the retriever load once, at its first call."""
    from rolecall.lm.embedded import DEFAULT_LM

    if "top_k" not in options and "top_k" in option_names(get_program_class(args.program)):
        options = {**options, "top_k": args.k}
    loaded: dict[str, Any] = {}

    def build() -> Any:
        if not loaded:
            if args.served_url:
                from rolecall.lm.served import ServedLM

                loaded["lm"] = ServedLM(args.served_url, args.model or DEFAULT_LM)
            else:
                from rolecall.lm.engines import make_lm

                loaded["lm"] = make_lm(args.model, engine=args.engine)
            loaded["retriever"] = build_retriever("bm25", corpus, args.k)
        return start_program(args, loaded["retriever"], loaded["lm"], options)

    return build


def _print_results(result: Any, args: argparse.Namespace, storage: Path) -> None:
    study = result.study
    trials = study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    print(f"\nstudy {study.study_name!r} ({storage}): {len(trials)} trials, "
          + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + f"; {result.ran} run now")  # fmt: skip
    print(f"{'#':>4}  {'state':<9} {'dev ' + args.metric:>8}  config")
    base = None
    for t in trials:
        value = f"{t.value:.4f}" if t.value is not None else "-"
        fields = _flat(t.user_attrs.get("config") or {})
        shown = " ".join(f"{k}={_short(v)}" for k, v in fields.items())
        if t.user_attrs.get("defaults"):
            shown += "  (defaults)"
            base = t
        print(f"{t.number:>4}  {t.state.name:<9} {value:>8}  {shown}")
    written = result.written
    if result.best_config is None:
        print("no trial completed yet: no best config")
    else:
        best = study.best_trial
        print(f"best: trial {best.number}, dev {args.metric} {best.value:.4f}")
        if base is not None and base.value is not None:
            print(f"defaults: trial {base.number}, dev {args.metric} {base.value:.4f} (best - defaults: "
                  f"{best.value - base.value:+.4f})")  # fmt: skip
        print(f"best config: {written['best_config']}\n  compile it: rolecall compile --program {args.program} "
              f"--optimizer {args.optimizer} --config {written['best_config']} --out DIR")  # fmt: skip
    print(f"trials: {written['trials']}")
    if "plots" in written:
        print(f"plots: {', '.join(str(p) for p in sorted(written['plots'].glob('*.png')))}")


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else json.dumps(value)
