"""OPERA's built-in demos, built from gold decompositions (Small models need them: SmolLM2-135M parses DSPy's
ChatAdapter format 0/5 zero-shot and 5/5 with three demos):

- plan: question -> sub-goals, the gold ``#k`` references rewritten as ``[entity from step k]``;
- analysis: (sub-question, gold passage + a distractor) -> yes + sub-answer; plus one (sub-question, distractors) -> no;
- rewrite: (sub-question, distractors, missing information) -> a query naming the entity to look up;
- synthesis: (question, sub-question -> answer lines) -> the answer.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import dspy

from rolecall.data.types import Document, Example
from rolecall.programs.core.demo_source import (
    as_corpus_mapping,
    demo_passages,
    filled_steps,
    gold_and_noise,
    interleave,
    placeholder_plan,
    select_examples,
    steps_with_gold,
)
from rolecall.programs.core.demos import built_in_demos

__all__ = ["opera_demos", "default_opera_demos"]

_NULL_ANSWER = "unknown"
_NO_MISSING = "none"


def opera_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Up to ``n`` demos for each of OPERA's ``plan``, ``analysis``, ``rewrite`` and ``synthesis`` roles (a demo
    builder as :mod:`rolecall.programs.core.demos` describes): the sub-goals come from the gold decompositions of
    ``examples``, the gold and distractor passages (picked with ``seed``) from ``corpus``, a mapping id -> document or
    a list of documents. Returns role -> ``dspy.Example`` s holding the role's input and output fields."""
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    chosen = select_examples(examples, n)
    demos: dict[str, list[dspy.Example]] = {"plan": [], "analysis": [], "rewrite": [], "synthesis": []}
    for e in chosen:
        demos["plan"].append(dspy.Example(question=e.question, sub_goals=placeholder_plan(e)).with_inputs("question"))
        evidence = "\n".join(f"{q} -> {s.answer}" for q, s in filled_steps(e))
        demos["synthesis"].append(
            dspy.Example(question=e.question, evidence=evidence, answer=e.answer).with_inputs("question", "evidence")
        )
    # analysis / rewrite use single sub-steps: the last step of each chosen example, then earlier ones
    steps = steps_with_gold(chosen, corpus)
    for i, (question, step) in enumerate(steps[: max(n - 1, 1)]):
        gold, noise = gold_and_noise(corpus, step.supporting_ids, rng)
        shown = interleave(gold, noise, i)
        demos["analysis"].append(
            dspy.Example(
                sub_goal=question,
                passages=demo_passages(shown),
                sufficient="yes",
                answer=step.answer,
                confidence="high",
                missing_information=_NO_MISSING,
            ).with_inputs("sub_goal", "passages")
        )
    for i, (question, step) in enumerate(steps[:n]):
        gold, distractors = gold_and_noise(corpus, step.supporting_ids, rng, n_noise=2)
        entity = gold[0].title
        missing = f"a passage about {entity}"
        noise = demo_passages(distractors)
        if i == 0 and n > 1:  # the negative analysis demo
            demos["analysis"].append(
                dspy.Example(
                    sub_goal=question,
                    passages=noise,
                    sufficient="no",
                    answer=_NULL_ANSWER,
                    confidence="low",
                    missing_information=missing,
                ).with_inputs("sub_goal", "passages")
            )
        demos["rewrite"].append(
            dspy.Example(sub_goal=question, passages=noise, missing_information=missing, query=entity).with_inputs(
                "sub_goal", "passages", "missing_information"
            )
        )
    demos["analysis"] = demos["analysis"][:n]
    return demos


default_opera_demos = built_in_demos(opera_demos)
