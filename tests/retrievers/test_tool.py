"""``retriever.as_tool()``: a callable ``dspy.Tool`` returning numbered passages, usable inside ``dspy.ReAct``."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.data.types import Document
from rolecall.retrievers import BM25, Passage, retriever_tool
from rolecall.retrievers.tool import NO_PASSAGES, format_passages

CORPUS = [
    Document("d0", "Paris", "Paris is the capital of France."),
    Document("d1", "Rome", "Rome is the capital of Italy."),
    Document("d2", "Dijon", "Dijon is famous for mustard."),
]


@pytest.fixture(scope="module")
def bm25() -> BM25:
    return BM25(CORPUS)


def test_as_tool_returns_a_callable_dspy_tool(bm25: BM25) -> None:
    tool = bm25.as_tool(k=2)
    assert isinstance(tool, dspy.Tool)
    assert tool.name == "search" and list(tool.args) == ["query"] and tool.args["query"]["type"] == "string"
    out = tool(query="capital of France")
    assert out.splitlines()[0] == "[1] Paris | Paris is the capital of France."
    assert out.splitlines()[1].startswith("[2] Rome | ")
    assert len(out.splitlines()) == 2


def test_empty_result_says_no_passages_found(bm25: BM25) -> None:
    tool = retriever_tool(bm25, k=3, name="wiki")
    assert tool.name == "wiki"
    assert tool(query="") == NO_PASSAGES
    assert tool(query="zebra") == NO_PASSAGES
    assert "no passages found" in NO_PASSAGES.lower()


def test_format_passages_without_title() -> None:
    assert format_passages([Passage("a", "", "bare text"), Passage("b", "T", "x")]) == "[1] bare text\n[2] T | x"


def test_invalid_k(bm25: BM25) -> None:
    with pytest.raises(ValueError, match="k must be >= 1"):
        retriever_tool(bm25, k=0)


def test_react_agent_calls_the_tool(bm25: BM25) -> None:
    lm = DummyLM(
        [
            {"next_thought": "Search.", "next_tool_name": "search", "next_tool_args": {"query": "mustard"}},
            {"next_thought": "Done.", "next_tool_name": "finish", "next_tool_args": {}},
            {"reasoning": "Dijon.", "answer": "Dijon"},
        ]
    )
    agent = dspy.ReAct("question -> answer", tools=[bm25.as_tool(k=1)], max_iters=3)
    with dspy.context(lm=lm):
        prediction = agent(question="Which city is famous for mustard?")
    assert prediction.answer == "Dijon"
    assert prediction.trajectory["observation_0"] == "[1] Dijon | Dijon is famous for mustard."


def test_as_tool_checks_k_and_uses_the_default(bm25: BM25) -> None:
    with pytest.raises(ValueError, match="k must be >= 1"):
        bm25.as_tool(k=0)  # was silently replaced by default_k
    assert "top 5 passages" in bm25.as_tool().desc


def test_base_and_tool_have_no_import_cycle() -> None:
    """``base`` never imports ``tool`` (at module level or inside a function), neither imports inside a function, and
    each imports on its own in a fresh process."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    import rolecall.retrievers.base as base
    import rolecall.retrievers.tool as tool

    for module in (base, tool):
        tree = ast.parse(Path(module.__file__).read_text())
        nested = [
            node.lineno
            for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(fn)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        ]
        assert nested == [], f"{module.__name__} imports inside a function at lines {nested}"
    imported = {
        node.module for node in ast.walk(ast.parse(Path(base.__file__).read_text())) if isinstance(node, ast.ImportFrom)
    }
    assert "rolecall.retrievers.tool" not in imported
    for name in ("rolecall.retrievers.tool", "rolecall.retrievers.base"):
        subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, check=True)
