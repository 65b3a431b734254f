"""Default few-shot demos for STRIDE's roles, built from examples with gold decompositions.

Every role of SmolLM2-135M needs two or three demos to follow DSPy's ChatAdapter format. From each gold decomposition:

- meta_planner: question -> General Strategy (each gold step with its entity names replaced by their types);
- planner: (question, General Strategy) -> Concrete Plan (the gold sub-questions, ``#k`` written as
  ``[type from step k]``); a comparison gets a last, reasoning-only step (the direct-plan ablation drops the strategy);
- supervisor: a first ``retrieve``, a ``rewrite`` after a failed query (naming the entity to look up) and an
  ``answer`` over solved comparison steps;
- extractor: (query, gold passage + distractor) -> the passage sentence holding the answer; (query, distractors) ->
  none;
- reasoner: (sub-question, facts) -> sub-answer, and a comparison answered from solved sub-answers;
- fallback: (question, unfinished plan P_q: strategy and sub-questions with answers or pending, facts, passages) -> the
  gold answer.

:func:`default_stride_demos` builds them once per process from ``default_demo_source()`` and returns copies.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

import dspy

from rolecall.data.types import Document, Example
from rolecall.programs.core.demo_source import (
    as_corpus_mapping,
    demo_passages,
    distractor_docs,
    docs_by_id,
    gold_and_noise,
    interleave,
    steps_with_gold,
)
from rolecall.programs.core.demos import built_in_demos
from rolecall.programs.stride.state import StrideState, format_facts

__all__ = ["stride_demos", "default_stride_demos", "gold_plan", "gold_strategy"]

_TYPE_ORDER = ("compositional", "comparison", "inference", "single", "intersection", "bridge", "bridge_comparison")
_PRONOUN = re.compile(r"^(It|He|She|They)\b")


def _doc_type(doc: Document) -> str:
    head = doc.id.split("/", 1)[0] if "/" in doc.id else ""
    return head if head.isalpha() else "entity"


def _title_types(example: Example, corpus: Mapping[str, Document]) -> dict[str, str]:
    docs = docs_by_id(corpus, [i for s in example.decomposition or [] for i in s.supporting_ids])
    return {d.title: _doc_type(d) for d in docs}


def _answer_type(answer: str, title_types: Mapping[str, str]) -> str:
    if re.fullmatch(r"\d{3,4}", answer.strip()):
        return "year"
    return title_types.get(answer.strip(), "entity")


def _leaves(n_steps: int, plan: Sequence[str]) -> list[int]:
    referenced = {int(k) for text in plan for k in re.findall(r"from step (\d+)\]", text)}
    return [k for k in range(1, n_steps + 1) if k not in referenced]


def gold_plan(example: Example, corpus: Mapping[str, Document]) -> list[str]:
    """The gold Concrete Plan of ``example``: its sub-questions with ``#k`` as ``[type from step k]``, plus a last
    reasoning step over the unreferenced steps when the question's answer is not the last sub-answer (comparisons).

    Example:
        >>> from rolecall.data.types import SubStep
        >>> ex = Example("x", "Who directed the film Y?", ["Ada"], decomposition=[SubStep("Who directed Y?", "Ada")])
        >>> gold_plan(ex, {})
        ['Who directed Y?']
    """
    steps = example.decomposition or []
    types = _title_types(example, corpus)
    kinds = {k: _answer_type(s.answer, types) for k, s in enumerate(steps, start=1)}
    plan = [
        re.sub(r"#(\d+)\b", lambda m: f"[{kinds.get(int(m.group(1)), 'entity')} from step {m.group(1)}]", s.question)
        for s in steps
    ]
    if steps and steps[-1].answer.strip().lower() != example.answer.strip().lower():
        refs = " and ".join(f"[{kinds[k]} from step {k}]" for k in _leaves(len(steps), plan))
        plan.append(f"Given {refs}: {example.question}")
    return plan


def gold_strategy(example: Example, corpus: Mapping[str, Document]) -> list[str]:
    """The General Strategy of ``example``: each gold plan step with the entity names replaced by their types.

    ``"In which city was the band Thuvex Hollows formed?"`` becomes ``"In which city was the band formed?"`` and
    ``"[person from step 1]"`` becomes ``"the person from step 1"``; a last comparison step becomes
    ``"Compare the answers of steps 1 and 2."``.
    """
    types = _title_types(example, corpus)
    plan = gold_plan(example, corpus)
    n_gold = len(example.decomposition or [])
    out = []
    for i, text in enumerate(plan, start=1):
        if i > n_gold:  # the added reasoning step
            refs = re.findall(r"from step (\d+)", text)
            out.append(f"Compare the answers of steps {' and '.join(refs)}.")
            continue
        for title, kind in sorted(types.items(), key=lambda kv: -len(kv[0])):  # longer names first
            text = re.sub(rf"(?:\bthe\s+)?(?:\b{kind}\s+)?{re.escape(title)}", f"the {kind}", text)
        text = re.sub(r"\[(\w+) from step (\d+)\]", r"the \1 from step \2", text)
        text = re.sub(r"\bthe (\w+) of the \1 from step", r"the \1 from step", text)
        out.append(re.sub(r"\bthe the\b", "the", text))
    return out


def _fact(doc: Document, answer: str) -> list[str]:
    """The sentences of ``doc`` that hold ``answer`` (a leading pronoun replaced by the title); else its first one."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", doc.text) if s.strip()]
    parts = [p.strip() for p in re.split(r",\s+(?=[A-Za-z])| and ", answer) if p.strip()] or [answer]
    hits = [s for s in sentences if any(p.lower() in s.lower() for p in parts)] or sentences[:1]
    return [_PRONOUN.sub(doc.title, s) for s in hits[:2]]


def _pick(examples: Sequence[Example], n: int) -> list[Example]:
    usable = [e for e in examples if e.decomposition and all(s.question and s.answer for s in e.decomposition)]
    chosen: list[Example] = []
    for kind in _TYPE_ORDER:
        match = next((e for e in usable if e.type == kind), None)
        if match is not None and len(chosen) < n:
            chosen.append(match)
    chosen += [e for e in usable if e not in chosen][: n - len(chosen)]
    return chosen


def _state(plan: list[str], answers: Mapping[int, str], strategy: Sequence[str] = ()) -> StrideState:
    state, _ = StrideState.from_plan(plan, strategy)
    state.solved.update(answers)  # gold answers, taken as they are
    return state


def stride_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for STRIDE's ``meta_planner``, ``planner``, ``supervisor``, ``extractor``, ``reasoner`` and ``fallback``
    roles.

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them), for the gold and distractor passages.
        n: demos per role (at most; fewer when the examples do not offer a case).
        seed: picks the distractor passages.

    Returns:
        Role name -> list of ``dspy.Example`` with the role's input and output fields (the ``planner`` demos have
        ``strategy`` as an input; the direct-plan ablation drops it, see
        :func:`~rolecall.programs.stride.parse.fit_demo`).
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    chosen = _pick(examples, n)
    roles = ("meta_planner", "planner", "supervisor", "extractor", "reasoner", "fallback")
    demos: dict[str, list[dspy.Example]] = {r: [] for r in roles}
    for e in chosen:
        strategy = gold_strategy(e, corpus)
        demos["meta_planner"].append(dspy.Example(question=e.question, steps=strategy).with_inputs("question"))
        demos["planner"].append(
            dspy.Example(question=e.question, strategy=strategy, sub_questions=gold_plan(e, corpus)).with_inputs(
                "question", "strategy"
            )
        )
    n_steps = {e.id: len(e.decomposition or []) for e in chosen}
    chains = [e for e in chosen if n_steps[e.id] > 1 and len(gold_plan(e, corpus)) == n_steps[e.id]]
    comparisons = [e for e in chosen if len(gold_plan(e, corpus)) > n_steps[e.id]]
    _supervisor_demos(demos["supervisor"], chains, comparisons, corpus)
    _execution_demos(demos, chosen, comparisons, corpus, rng, n)
    for e in chains[: max(1, n - 1)]:
        plan, steps = gold_plan(e, corpus), e.decomposition or []
        state = _state(plan, {k: s.answer for k, s in enumerate(steps[:-1], start=1)}, gold_strategy(e, corpus))
        last_docs = docs_by_id(corpus, steps[-1].supporting_ids)[:1]
        facts = [f for s in steps[:-1] for d in docs_by_id(corpus, s.supporting_ids)[:1] for f in _fact(d, s.answer)]
        demos["fallback"].append(
            dspy.Example(
                question=e.question,
                plan=state.render_plan(),
                facts=format_facts(facts),
                passages=demo_passages(last_docs + distractor_docs(corpus, steps[-1].supporting_ids, 1, rng)),
                answer=e.answer,
            ).with_inputs("question", "plan", "facts", "passages")
        )
    return {role: d[:n] for role, d in demos.items()}


def _supervisor_demos(
    out: list[dspy.Example], chains: list[Example], comparisons: list[Example], corpus: Mapping[str, Document]
) -> None:
    def example(e: Example, state: StrideState, sq_id: int, failed: list[str], action: str, query: str) -> None:
        out.append(
            dspy.Example(
                question=e.question,
                progress=state.render(),
                sub_question=state.filled(sq_id),
                failed_queries="; ".join(failed) or "none",
                action=action,
                query=query,
            ).with_inputs("question", "progress", "sub_question", "failed_queries")
        )

    if chains:  # a first search: the sub-question itself is a concise, entity-grounded query
        e = chains[0]
        state = _state(gold_plan(e, corpus), {})
        example(e, state, 1, [], "retrieve", state.filled(1))
    if chains:  # a rewrite after a failed query
        e = chains[-1]
        steps = e.decomposition or []
        state = _state(gold_plan(e, corpus), {1: steps[0].answer})
        entity = next((d.title for d in docs_by_id(corpus, steps[1].supporting_ids)), steps[0].answer)
        example(e, state, 2, [state.filled(2)], "rewrite", entity)
    if comparisons:  # the solved answers already answer the last step: no search
        e = comparisons[0]
        plan, steps = gold_plan(e, corpus), e.decomposition or []
        state = _state(plan, {k: s.answer for k, s in enumerate(steps, start=1)})
        example(e, state, len(plan), [], "answer", state.filled(len(plan)))


def _execution_demos(
    demos: dict[str, list[dspy.Example]],
    chosen: list[Example],
    comparisons: list[Example],
    corpus: Mapping[str, Document],
    rng: random.Random,
    n: int,
) -> None:
    # single sub-steps: the last step of each chosen example first (its query holds a filled-in answer)
    steps = steps_with_gold(chosen, corpus)
    for i, (question, step) in enumerate(steps[: max(n - 1, 1)]):
        golds, noise = gold_and_noise(corpus, step.supporting_ids, rng)
        gold = golds[0]
        facts = _fact(gold, step.answer)
        query = question if i % 2 == 0 else gold.title  # a sub-question, then a rewrite-style entity query
        demos["extractor"].append(
            dspy.Example(
                query=query,
                passages=demo_passages(interleave(golds, noise, i)),
                facts=format_facts(facts),
            ).with_inputs("query", "passages")
        )
        demos["reasoner"].append(
            dspy.Example(sub_question=question, facts=format_facts(facts), answer=step.answer).with_inputs(
                "sub_question", "facts"
            )
        )
    if steps and n > 1:  # nothing relevant retrieved: no facts
        question, step = steps[-1]
        noise = distractor_docs(corpus, step.supporting_ids, 2, rng)
        demos["extractor"].append(
            dspy.Example(query=question, passages=demo_passages(noise), facts="none").with_inputs("query", "passages")
        )
    if comparisons and n > 1:  # the answer action: reason over the solved sub-answers
        e = comparisons[0]
        plan, gold_steps = gold_plan(e, corpus), e.decomposition or []
        state = _state(plan, {k: s.answer for k, s in enumerate(gold_steps, start=1)})
        demos["reasoner"].append(
            dspy.Example(
                sub_question=state.filled(len(plan)), facts=format_facts(state.known_answers()), answer=e.answer
            ).with_inputs("sub_question", "facts")
        )


default_stride_demos = built_in_demos(stride_demos)
"""STRIDE's built-in demos from ``default_demo_source()`` (cached; each call returns fresh lists of copies)."""
