"""Built-in few-shot demos of the agentic baselines: ReAct's ``react`` / ``extract`` roles and Search-R1's ``agent``.

Both agents act in turns, so one demo is one turn of a gold episode built from a gold decomposition: search each
filled sub-question in order (the observation holds the gold passage of that hop and a distractor), then finish.
The ``n`` demos are taken at different stages so the model sees every move: the final move (``finish`` for ReAct,
``<answer>`` for Search-R1), a follow-up search that uses what the first one found, and the first search (last, as
the nearest demo is the one a small model copies most). ReAct's
``extract`` demos read a whole episode (gold passages only, to keep the prompt short) and give a one-line reasoning
naming the last sub-answer.

SmolLM2-135M does not parse DSPy's ChatAdapter format zero-shot, which is why these exist; ``dspy.ReAct`` itself has no
default demos (its bootstrapped demos hold partial trajectories, which is what these hand-built ones imitate).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import dspy

from rolecall.data.types import Document, Example
from rolecall.programs.baselines.search_r1_actions import NO_SEARCHES_YET, SearchR1Action, render_turn
from rolecall.programs.core.demo_source import (
    as_corpus_mapping,
    demo_passages,
    docs_by_id,
    filled_steps,
    gold_and_noise,
    interleave,
    select_examples,
)
from rolecall.programs.core.demos import built_in_demos
from rolecall.signatures.baselines import REACT_HISTORY_FIELD

__all__ = [
    "react_demos",
    "search_r1_demos",
    "default_react_demos",
    "default_search_r1_demos",
    "format_react_trajectory",
]


def format_react_trajectory(steps: Mapping[str, Any], adapter: dspy.Adapter | None = None) -> str:
    """A ReAct trajectory dict (``thought_0``, ``tool_name_0``, ``tool_args_0``, ``observation_0``, ...) as the text
    ``dspy.ReAct`` shows the LM: each entry under its own ``[[ ## key ## ]]`` header (ChatAdapter by default)."""
    adapter = adapter or dspy.ChatAdapter()
    signature = dspy.Signature(f"{', '.join(steps.keys())} -> x")
    return adapter.format_user_message_content(signature, dict(steps))


def _episode(example: Example, corpus: Mapping[str, Document], rng: random.Random) -> list[dict[str, str]]:
    """The gold search episode of ``example``: per hop its query, gold answer and observation (gold + distractor)."""
    turns = []
    for i, (question, step) in enumerate(filled_steps(example)):
        gold, noise = gold_and_noise(corpus, step.supporting_ids, rng)
        shown = interleave(gold, noise, i)
        turns.append(
            {"query": question, "answer": step.answer, "observation": demo_passages(shown), "gold": demo_passages(gold)}
        )
    return turns


def _thought(turns: list[dict[str, str]], stage: int) -> str:
    """What the agent thinks before move ``stage`` (0 = first search, ``len(turns)`` = finish).

    Kept to one short line: SmolLM2-135M copies the shape of demo thoughts, and a thought that quotes the passages
    ("The passages say: [1] ...") runs past the token budget.
    """
    if stage == 0:
        return f"First find: {turns[0]['query']}"
    found = f"Found {turns[stage - 1]['answer']}."
    if stage == len(turns):
        return f"{found} Done."
    return f"{found} Now find: {turns[stage]['query']}"


def _stages(n: int, hops: list[int]) -> list[int]:
    """The stage of demo ``i``: the first search, then follow-up searches, and the final move for the last demo."""
    return [h if i == n - 1 else min(i, max(h - 1, 0)) for i, h in enumerate(hops)]


def _chosen(examples: Sequence[Example], corpus: Mapping[str, Document], n: int) -> list[Example]:
    usable = [e for e in examples if all(docs_by_id(corpus, s.supporting_ids) for s in e.decomposition or [])]
    return select_examples(usable, n)


def react_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for ``ReActAgent``'s ``react`` (one turn each) and ``extract`` (a whole episode each) roles.

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them), for the gold and distractor passages.
        n: demos per role.
        seed: picks the distractor passages.

    Returns:
        ``{"react": [...], "extract": [...]}`` with the fields of ``dspy.ReAct``'s signatures (the trajectory under
        :data:`~rolecall.signatures.baselines.REACT_HISTORY_FIELD`).
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    chosen = _chosen(examples, corpus, n)
    episodes = [_episode(e, corpus, rng) for e in chosen]
    demos: dict[str, list[dspy.Example]] = {"react": [], "extract": []}
    for e, turns, stage in zip(chosen, episodes, _stages(len(chosen), [len(t) for t in episodes]), strict=True):
        past: dict[str, Any] = {}
        for i in range(stage):
            past |= {f"thought_{i}": _thought(turns, i), f"tool_name_{i}": "search"}
            past |= {f"tool_args_{i}": {"query": turns[i]["query"]}, f"observation_{i}": turns[i]["observation"]}
        finish = stage == len(turns)
        demos["react"].append(
            dspy.Example(
                question=e.question,
                **{REACT_HISTORY_FIELD: format_react_trajectory(past)},
                next_thought=_thought(turns, stage),
                next_tool_name="finish" if finish else "search",
                next_tool_args={} if finish else {"query": turns[stage]["query"]},
            ).with_inputs("question", REACT_HISTORY_FIELD)
        )
    demos["react"].reverse()  # the first-search demo last: small models lean on the nearest demo, and every run
    # starts with a search (copying a finish demo on turn 0 would end the episode before any retrieval)
    for e, turns in zip(chosen, episodes, strict=True):
        past = {}
        for i, turn in enumerate(turns):  # gold passages only: whole episodes are long, and extract reads them all
            past |= {f"thought_{i}": _thought(turns, i), f"tool_name_{i}": "search"}
            past |= {f"tool_args_{i}": {"query": turn["query"]}, f"observation_{i}": turn["gold"]}
        last = len(turns)
        past |= {f"thought_{last}": _thought(turns, last), f"tool_name_{last}": "finish", f"tool_args_{last}": {}}
        past[f"observation_{last}"] = "Completed."
        reasoning = f"The last search found {turns[-1]['answer']}."  # short: a listed chain invites repetition
        demos["extract"].append(
            dspy.Example(
                question=e.question,
                **{REACT_HISTORY_FIELD: format_react_trajectory(past)},
                reasoning=reasoning,
                answer=e.answer,
            ).with_inputs("question", REACT_HISTORY_FIELD)
        )
    return demos


def search_r1_demos(
    examples: Sequence[Example],
    corpus: Mapping[str, Document] | Sequence[Document],
    *,
    n: int = 3,
    seed: int = 0,
    show_reasoning: bool = True,
) -> dict[str, list[dspy.Example]]:
    """Demos for ``SearchR1Agent``'s ``agent`` role: one turn of a gold episode each (search, follow-up, answer).

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them), for the gold and distractor passages.
        n: number of demos.
        seed: picks the distractor passages.
        show_reasoning: whether earlier turns in ``interaction`` show their ``<think>`` text (match the program).

    Returns:
        ``{"agent": [...]}`` with fields ``question``, ``interaction``, ``reasoning``, ``action``.
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    chosen = _chosen(examples, corpus, n)
    episodes = [_episode(e, corpus, rng) for e in chosen]
    out = []
    for e, turns, stage in zip(chosen, episodes, _stages(len(chosen), [len(t) for t in episodes]), strict=True):
        rendered = [
            render_turn(
                _thought(turns, i),
                SearchR1Action(kind="search", content=turns[i]["query"], valid=True),
                turns[i]["observation"],
                show_reasoning=show_reasoning,
            )
            for i in range(stage)
        ]
        action = f"<answer>{e.answer}</answer>" if stage == len(turns) else f"<search>{turns[stage]['query']}</search>"
        out.append(
            dspy.Example(
                question=e.question,
                interaction="\n".join(rendered) or NO_SEARCHES_YET,
                reasoning=_thought(turns, stage),
                action=action,
            ).with_inputs("question", "interaction")
        )
    return {"agent": out[::-1]}  # the first-search demo last, as for ReAct


default_react_demos = built_in_demos(react_demos)
default_search_r1_demos = built_in_demos(search_r1_demos)
