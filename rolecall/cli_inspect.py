"""The inspection commands: what exists and what a run did, without reading JSON by hand.

* ``rolecall programs [NAME]``: the registered programs (class, roles and adapters, one line each) and the weight
  optimizers with the programs they apply to; with NAME, one program's roles, adapter groups, options (type, default,
  doc) and optimizers.
* ``rolecall show RUN [--question ID]``: an eval run's summary and a row per question; with ``--question``, that
  question's trajectory step by step.
* ``rolecall report RUN [--out FILE]``: the run as one self-contained HTML page (:mod:`rolecall.evaluation.report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolecall.cli_common import add_command, add_common
from rolecall.cli_compile import APPLIES_TO, OPTIMIZERS
from rolecall.cli_fields import default_text, option_docs, type_text
from rolecall.optimizers.registry import LiveMapping, optimizer_entry
from rolecall.programs.registry import PROGRAMS, get_program_class, get_system, program_names

__all__ = [
    "OPTIMIZER_SUMMARIES",
    "OptionInfo",
    "ProgramInfo",
    "add_inspect_parsers",
    "cmd_programs",
    "cmd_report",
    "cmd_show",
    "option_docs",
    "program_info",
]


OPTIMIZER_SUMMARIES: Mapping[str, str] = LiveMapping(lambda: {n: optimizer_entry(n).summary for n in OPTIMIZERS})
"""One line per ``rolecall compile --optimizer`` name."""

SWITCHES = (
    ("demos", "auto | none", "auto", "the built-in few-shot demos, or none"),
    (
        "demo_policy",
        "always | never | until_trained",
        "until_trained",
        "when each role sees its demos (until_trained: until its adapter is trained demo-free)",
    ),
    ("per_role_adapters", "bool", "True", "False: no LoRA adapters, every role calls the LM itself"),
)
"""The options every program takes besides its ``Options``: (name, type, default, doc)."""

_WIDTH = 110  # the width the listings wrap to


# ------------------------------------------------------------------------------------------------------ parsers
_PROGRAMS_HELP = "list the programs and optimizers; `rolecall programs NAME` shows one program's roles and options"
_PROGRAMS_DESCRIPTION = (
    "List the registered programs (class, roles and adapters, one line each) and the weight\n"
    "optimizers with the programs they apply to. With NAME: that program's roles and adapter groups, its\n"
    "options (-o KEY=VALUE of `rolecall eval` / `rolecall compile`) with type, default and doc, and the\n"
    "optimizers that apply to it."
)
_PROGRAMS_EPILOG = "examples:\n  rolecall programs\n  rolecall programs opera"

_SHOW_HELP = "print an eval run's summary and a row per question, or one question's trajectory"
_SHOW_DESCRIPTION = (
    "Read an eval output folder (`rolecall eval --out RUN`: records.jsonl, summary.json,\n"
    "config.json). Without --question: the run's summary and a table of its questions (id, EM, F1, steps,\n"
    "prediction vs gold). With --question ID: that question's trajectory, step by step: the role and its\n"
    "adapter, what it saw (inputs, cut short), what it said, what it retrieved, errors and rewards."
)
_SHOW_EPILOG = (
    "examples:\n  rolecall show runs/opera-hotpot\n"
    "  rolecall show runs/opera-hotpot --question 5a8b57f25542995d1e6f1371"
)

_REPORT_HELP = "write an eval run as one self-contained HTML page (summary, question table, trajectories)"
_REPORT_DESCRIPTION = (
    "Write a static HTML report of an eval output folder: the summary, a table with one row per\n"
    "question and each question's trajectory in a collapsible block. One file, inline CSS, no scripts and no\n"
    "external assets: open it in any browser, attach it, or serve it as it is."
)
_REPORT_EPILOG = "examples:\n  rolecall report runs/opera-hotpot\n  rolecall report runs/opera-hotpot --out opera.html"


def add_inspect_parsers(sub: Any) -> None:
    """Adds ``rolecall programs``, ``rolecall show`` and ``rolecall report`` to the subcommands ``sub``."""
    p = add_command(sub, "programs", _PROGRAMS_HELP, _PROGRAMS_DESCRIPTION, _PROGRAMS_EPILOG)
    p.add_argument("name", nargs="?", default=None, metavar="NAME", help="a registered program (default: list all)")
    add_common(p)
    p.set_defaults(func=cmd_programs)

    p = add_command(sub, "show", _SHOW_HELP, _SHOW_DESCRIPTION, _SHOW_EPILOG)
    p.add_argument("run", type=Path, metavar="RUN", help="an eval output folder")
    p.add_argument("--question", default=None, metavar="ID", help="show this question's trajectory")
    add_common(p)
    p.set_defaults(func=cmd_show)

    p = add_command(sub, "report", _REPORT_HELP, _REPORT_DESCRIPTION, _REPORT_EPILOG)
    p.add_argument("run", type=Path, metavar="RUN", help="an eval output folder")
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="the HTML file (default: RUN/report.html)")
    add_common(p)
    p.set_defaults(func=cmd_report)


# --------------------------------------------------------------------------------------------- program metadata
@dataclass
class OptionInfo:
    """One program option: name, type (with its range), default and doc."""

    name: str
    type: str
    default: str
    doc: str


@dataclass
class ProgramInfo:
    """What ``rolecall programs`` says about one registered program."""

    name: str
    cls: type
    description: str
    adapters: dict[str, list[str]]
    options: list[OptionInfo]
    optimizers: list[str]


def _description(cls: type) -> str:
    """The first sentence of the class docstring's first paragraph, on one line."""
    paragraph = " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split()).replace("``", "")
    end = paragraph.find(". ")
    return paragraph[: end + 1] if end >= 0 else paragraph


def applicable_optimizers(name: str) -> list[str]:
    """The ``--optimizer`` names that apply to program ``name`` (``sft`` where it has gold-path targets)."""
    return get_system(name).optimizer_names()


def program_info(name: str) -> ProgramInfo:
    """Roles, adapters, options and optimizers of the registered program ``name``; nothing loads but its module.

    Raises:
        ConfigError: ``name`` is not registered (the message lists the registered names).
    """
    from rolecall.programs.core.options import option_types

    cls = get_program_class(name)
    program = cls(None, demos=None)  # no retriever, no LM: only the roles and adapter groups are read
    options_cls = cls.Options
    types, docs = option_types(options_cls), option_docs(options_cls)
    options = [
        OptionInfo(f.name, type_text(f, types[f.name]), default_text(f), docs.get(f.name, ""))
        for f in dataclasses.fields(options_cls)
    ]
    return ProgramInfo(name, cls, _description(cls), program.adapter_roles(), options, applicable_optimizers(name))


def _adapters_text(adapters: dict[str, list[str]]) -> str:
    """``roles: a, b (an adapter each)``, or ``adapters: planner=decomposer+replanner, extractor`` with groups."""
    if all([name] == roles for name, roles in adapters.items()):
        return f"roles: {', '.join(adapters)} (an adapter each)"
    return "adapters: " + ", ".join(f"{n}={'+'.join(r)}" if [n] != r else n for n, r in adapters.items())


# ------------------------------------------------------------------------------------------------------ commands
def cmd_programs(args: argparse.Namespace) -> int:
    """``rolecall programs [NAME]``: list every program and optimizer, or describe one program."""
    if args.name is not None:
        _print_program(program_info(args.name))
        return 0
    infos = [program_info(name) for name in program_names()]
    width = max(len(i.name) for i in infos) + 2
    cls_width = max(len(i.cls.__name__) for i in infos) + 2
    pad = " " * (2 + width + cls_width)
    print(f"programs ({len(infos)}; `rolecall programs NAME` shows one program's options):\n")
    for info in infos:
        lines = textwrap.wrap(info.description, _WIDTH - len(pad))
        lines += textwrap.wrap(
            _adapters_text(info.adapters), _WIDTH - len(pad), break_on_hyphens=False, break_long_words=False
        )
        print(f"  {info.name:<{width}}{info.cls.__name__:<{cls_width}}{lines[0]}")
        for line in lines[1:]:
            print(pad + line)
    print("\noptimizers (`rolecall compile --program NAME --optimizer OPT[,OPT]`):\n")
    width = max(len(o) for o in OPTIMIZERS) + 2
    for optimizer in OPTIMIZERS:
        if optimizer == "sft":
            programs = [i.name for i in infos if "sft" in i.optimizers]
        else:
            programs = list(APPLIES_TO[optimizer])
        lines = textwrap.wrap(OPTIMIZER_SUMMARIES[optimizer], _WIDTH - width - 2)
        lines += textwrap.wrap(f"applies to: {', '.join(programs)}", _WIDTH - width - 2)
        print(f"  {optimizer:<{width}}{lines[0]}")
        for line in lines[1:]:
            print(" " * (width + 2) + line)
    return 0


def _print_program(info: ProgramInfo) -> None:
    print(f"{info.name}: {info.cls.__name__} ({PROGRAMS[info.name].partition(':')[0]})")
    for line in textwrap.wrap(" ".join(inspect.cleandoc(info.cls.__doc__ or "").split("\n\n")[0].split()), 100):
        print(f"  {line.replace('``', '')}")
    print("\nroles (each runs on its adapter; roles in one adapter group share it):")
    width = max(len(r) for roles in info.adapters.values() for r in roles) + 2
    for adapter, roles in info.adapters.items():
        for role in roles:
            shared = [r for r in roles if r != role]
            print(f"  {role:<{width}}adapter {adapter}" + (f" (shared with {', '.join(shared)})" if shared else ""))
    print(f"\noptions (-o KEY=VALUE on `rolecall eval --program {info.name}` and `rolecall compile`):")
    rows = [(o.name, o.type, o.default, o.doc) for o in info.options] + list(SWITCHES)
    name_w = max(len(r[0]) for r in rows) + 2
    type_w = min(max(len(r[1]) for r in rows) + 2, 34)
    for name, type_, default, doc in rows:
        print(f"  {name:<{name_w}}{type_:<{type_w}}default {default}")
        for line in textwrap.wrap(doc, 96):
            print(f"      {line.replace('``', '')}")
    print(f"\noptimizers (`rolecall compile --program {info.name} --optimizer OPT[,OPT]`):")
    for optimizer in info.optimizers or []:
        print(f"  {optimizer:<15}{OPTIMIZER_SUMMARIES[optimizer]}")
    if not info.optimizers:
        print("  none yet: no gold-path targets for sft and no optimizer written for it")


def cmd_show(args: argparse.Namespace) -> int:
    """``rolecall show RUN [--question ID]``: a run's summary and questions, or one question's trajectory."""
    from rolecall.evaluation.records import format_summary
    from rolecall.evaluation.report import load_run, run_summary

    run = load_run(args.run)
    if args.question is not None:
        _print_trajectory(run.record(args.question))
        return 0
    print(run.title)
    print(format_summary(run_summary(run)))
    print()
    _print_questions(run.records)
    print(f"\none question's trajectory: rolecall show {args.run} --question ID")
    return 0


def _print_questions(records: list[Any]) -> None:
    from rolecall.evaluation.report import clip, fmt_number

    id_w = min(max(len(r.id) for r in records), 40) + 2
    print(f"{'id':<{id_w}}{'EM':>4}{'F1':>6}{'steps':>7}  {'prediction':<32}gold")
    for r in records:
        prediction = clip(r.prediction or "(empty)", 30, one_line=True)
        gold = clip(" | ".join(r.answers), 30, one_line=True)
        problem = r.error or r.call_error  # the program raised, or one of its LM calls failed
        flag = f"  error: {clip(problem, 60, one_line=True)}" if problem else ""
        print(f"{clip(r.id, 40):<{id_w}}{fmt_number(r.em, 0):>4}{fmt_number(r.f1):>6}{r.steps:>7}  "
              f"{prediction:<32}{gold:<32}{flag}".rstrip())  # fmt: skip


def _print_trajectory(record: Any) -> None:
    from rolecall.evaluation.report import clip, fmt_number, step_views

    print(f"question {record.id}: {record.question}")
    print(f"gold: {' | '.join(record.answers)}    prediction: {record.prediction or '(empty)'}")
    print(f"EM {fmt_number(record.em, 0)}  F1 {fmt_number(record.f1)}  {record.steps} steps, {record.lm_calls} LM "
          f"calls, {record.prompt_tokens + record.completion_tokens} tokens, {record.latency_s:.2f} s")  # fmt: skip
    if record.error or record.call_error:
        print(f"error: {record.error or record.call_error}")
    views = step_views(record)
    if not views:
        print("\n(no trajectory recorded)")
    for v in views:
        adapter = f" [adapter {v.adapter}]" if v.adapter else ""
        cost = f"{v.seconds:.2f} s" + (f", {v.tokens} tokens" if v.tokens else "")
        print(f"\n{v.index:>3}. {v.name}{adapter}  ({v.kind}, {cost})")
        for label, pairs, limit in (("saw", v.saw, 110), ("said", v.said, 160)):
            for key, text in pairs:
                print(f"       {label}: {key} = {clip(text, limit, one_line=True)}")
        if v.retrieved:
            titles = ", ".join(f"{title} [{pid}]" if title else pid for title, pid in v.retrieved)
            print(f"       retrieved: {clip(titles, 170, one_line=True)}")
        if v.notes:
            print(f"       notes: {clip(', '.join(f'{k}={t}' for k, t in v.notes), 170, one_line=True)}")
        for key, value in v.rewards.items():
            print(f"       reward: {key} = {fmt_number(value, 3)}")
        if v.error:
            print(f"       error: {clip(v.error, 170, one_line=True)}")


def cmd_report(args: argparse.Namespace) -> int:
    """``rolecall report RUN [--out FILE]``: write the run's HTML report."""
    from rolecall.evaluation.report import write_report

    path = write_report(args.run, args.out)
    print(f"report: {path}")
    return 0
