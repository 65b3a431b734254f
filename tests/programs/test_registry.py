"""Tests of the program registry: names, lazy imports and the errors that list the valid choices."""

from __future__ import annotations

import sys
import types

import pytest

from rolecall.errors import ConfigError
from rolecall.programs import registry
from rolecall.programs.registry import PROGRAMS, build_program, get_program_class, program_names


class Echo:
    def __init__(self, retriever=None, *, lm=None, **options):
        self.retriever, self.lm, self.options = retriever, lm, options


@pytest.fixture
def fake_module(monkeypatch):
    module = types.ModuleType("fake_registry_programs")
    module.Echo = Echo
    monkeypatch.setitem(sys.modules, "fake_registry_programs", module)
    monkeypatch.setitem(registry.PROGRAMS, "echo", "fake_registry_programs:Echo")


def test_the_issue_programs_are_registered():
    systems = {"opera", "reap", "cascaded_team", "hierarchical_team", "d2plan", "stride"}
    baselines = {"no_retrieval_cot", "single_step_rag", "ircot", "iter_retgen", "self_ask", "react", "search_r1"}
    assert systems | baselines <= set(PROGRAMS)
    assert program_names() == sorted(PROGRAMS)
    assert all(":" in target for target in PROGRAMS.values())


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown program 'nope'; choose one of: .*single_step_rag"):
        get_program_class("nope")


def test_build_program_passes_the_contract_arguments(fake_module):
    assert get_program_class("echo") is Echo
    program = build_program("echo", "retriever", "lm", max_steps=3)
    assert (program.retriever, program.lm, program.options) == ("retriever", "lm", {"max_steps": 3})


def test_broken_entries_are_config_errors(monkeypatch, fake_module):
    monkeypatch.setitem(registry.PROGRAMS, "ghost", "rolecall.programs.no_such_module:Ghost")
    with pytest.raises(ConfigError, match="does not exist"):
        get_program_class("ghost")
    monkeypatch.setitem(registry.PROGRAMS, "typo", "fake_registry_programs:Ehco")
    with pytest.raises(ConfigError, match="has no 'Ehco'"):
        get_program_class("typo")


def test_a_missing_dependency_is_not_hidden(monkeypatch, tmp_path):
    """A program module that exists but needs an uninstalled package raises that ImportError, not a ConfigError."""
    (tmp_path / "fake_registry_needs_dep.py").write_text("import rolecall_test_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.PROGRAMS, "needs_dep", "fake_registry_needs_dep:Thing")
    with pytest.raises(ModuleNotFoundError, match="rolecall_test_missing_dependency"):
        get_program_class("needs_dep")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_registered_program_imports_and_follows_the_contract(name):
    import inspect

    cls = get_program_class(name)
    params = inspect.signature(cls.__init__).parameters
    assert {"retriever", "lm", "demos", "lm_kwargs", "per_role_adapters", "adapter"} <= set(params), name
    assert params["lm"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_eval_cli_accepts_every_program(name):
    from rolecall.cli import build_parser

    args = build_parser().parse_args(["eval", "--program", name, "--dataset", "synthetic"])
    assert args.program == name


def test_every_public_name_of_the_flat_layout_still_imports():
    import rolecall.programs as programs

    old = """Program OPERA REAP CascadedTeam HierarchicalTeam D2Plan STRIDE NoRetrievalCoT SingleStepRAG IRCoT
    IterRetGen
    SelfAsk ReActAgent SearchR1Agent Trajectory Step LMCallRecorder format_passages parallel_map tool_steps d2plan_facts
    D2PlanFacts StrideState causal_rewrite_steps default_demos opera_demos cot_demos rag_demos""".split()
    assert [name for name in old if not hasattr(programs, name)] == []
    assert set(old) <= set(programs.__all__)


def test_default_demos_by_program_name_or_old_kind():
    from rolecall.programs import default_demos

    assert sorted(default_demos("opera")) == ["analysis", "plan", "rewrite", "synthesis"]
    assert [len(v) for v in default_demos("rag", n=2).values()] == [2]
    assert sorted(default_demos("cot")) == ["answer"]
    with pytest.raises(ConfigError, match="unknown demo kind 'nope'"):
        default_demos("nope")
