"""Built-in few-shot demos of the iterative retrieval baselines (IRCoT, Iter-RetGen, Self-Ask).

Demos come from examples with gold decompositions and the corpus holding their supporting documents (by default the
built-in world of :func:`rolecall.programs.core.demo_source.default_demo_source`). A reasoning sentence for a gold
sub-step is the sentence of its supporting document that states the sub-answer, with a leading pronoun replaced by the
document's title ("She was born in 1865 in Pelheim." -> "Staekys Granuvell was born in 1865 in Pelheim."), so the
chains read like the extractive chains of thought IRCoT and Iter-RetGen prompt with. The text formats the roles read
(the reasoning so far, the Self-Ask history) come from :mod:`rolecall.programs.baselines.chains`, as at run time.

- IRCoT ``reason``: (question, passages newest first, sentences so far) -> the next sentence; the last one ends with
  "So the answer is X."; ``answer``: (question, passages, reasoning) -> the short answer.
- Iter-RetGen ``generate``: (question, gold passages + a distractor) -> reasoning (the chain) + answer.
- Self-Ask ``ask``: (question, history) -> ``follow_up`` + the next sub-question, or ``final_answer`` + the answer;
  ``answer_followup``: (sub-question, gold passage + a distractor) -> the sub-answer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

import dspy

from rolecall.data.types import Document, Example, SubStep
from rolecall.programs.baselines.chains import ANSWER_CUE, NO_REASONING, format_history
from rolecall.programs.core.demo_source import (
    as_corpus_mapping,
    demo_passages,
    distractor_docs,
    docs_by_id,
    filled_steps,
    gold_and_noise,
    select_examples,
)
from rolecall.programs.core.demos import built_in_demos

__all__ = [
    "ircot_demos",
    "iter_retgen_demos",
    "self_ask_demos",
    "default_ircot_demos",
    "default_iter_retgen_demos",
    "default_self_ask_demos",
]

_PRONOUN = re.compile(r"^(He|She|It|They)\b|^(His|Her|Its|Their)\b")


def _fact_sentence(step: SubStep, corpus: Mapping[str, Document], fallback_question: str) -> str:
    """The supporting document's sentence that states ``step.answer``, its leading pronoun replaced by the title;
    ``"<question> <answer>."`` when no sentence states it."""
    for doc in docs_by_id(corpus, step.supporting_ids):
        for sentence in re.split(r"(?<=\.)\s+", doc.text):
            if step.answer in sentence:
                match = _PRONOUN.match(sentence)
                if match is not None:
                    name = doc.title if match.group(1) else f"{doc.title}'s"
                    sentence = name + sentence[match.end() :]
                return sentence.strip()
    return f"{fallback_question} {step.answer}."


def _chain(example: Example, corpus: Mapping[str, Document]) -> list[str]:
    return [_fact_sentence(s, corpus, q) for q, s in filled_steps(example)]


def _with_cue(sentence: str, answer: str) -> str:
    return f"{sentence} {ANSWER_CUE} {answer}."


def ircot_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for IRCoT's ``reason`` and ``answer`` roles (``n`` each).

    The ``reason`` demos are states of gold chains: the first demo continues a chain (its first sentence), the others
    end one (the last sentence, followed by "So the answer is X."). Passages are shown newest retrieval first, as the
    program shows them. One ``answer`` demo reads a chain without the answer cue (a run that spent its step budget).

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them).
        n: demos per role.
        seed: picks the distractor passages.

    Returns:
        ``{"reason": [...], "answer": [...]}``.
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    demos: dict[str, list[dspy.Example]] = {"reason": [], "answer": []}
    for k, e in enumerate(select_examples(examples, n)):
        steps = e.decomposition or []
        chain = _chain(e, corpus)
        i = 0 if k == 0 and len(steps) > 1 else len(steps) - 1
        newest_first = [d for s in reversed(steps[: i + 1]) for d in docs_by_id(corpus, s.supporting_ids[:1])]
        noise = distractor_docs(corpus, e.supporting_ids, 1, rng)
        shown = newest_first[:1] + noise + newest_first[1:2]
        sentence = chain[i] if i < len(steps) - 1 else _with_cue(chain[i], e.answer)
        demos["reason"].append(
            dspy.Example(
                question=e.question,
                passages=demo_passages(shown),
                reasoning=" ".join(chain[:i]) or NO_REASONING,
                next_sentence=sentence,
            ).with_inputs("question", "passages", "reasoning")
        )
        every_doc = [d for s in reversed(steps) for d in docs_by_id(corpus, s.supporting_ids[:1])]
        reasoning = " ".join(chain) if k == 1 else " ".join([*chain[:-1], _with_cue(chain[-1], e.answer)])
        demos["answer"].append(
            dspy.Example(
                question=e.question,
                passages=demo_passages(every_doc[:1] + noise + every_doc[1:2]),
                reasoning=reasoning,
                answer=e.answer,
            ).with_inputs("question", "passages", "reasoning")
        )
    return demos


def iter_retgen_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for Iter-RetGen's ``generate`` role: (question, two gold passages + a distractor) -> reasoning + answer.

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them).
        n: demos.
        seed: picks the distractor passages and where the distractor goes.

    Returns:
        ``{"generate": [...]}``.
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    out = []
    for e in select_examples(examples, n):
        gold = docs_by_id(corpus, e.supporting_ids)[-2:]
        docs = gold + distractor_docs(corpus, e.supporting_ids, 1, rng)
        rng.shuffle(docs)
        out.append(
            dspy.Example(
                question=e.question,
                passages=demo_passages(docs),
                reasoning=" ".join(_chain(e, corpus)),
                answer=e.answer,
            ).with_inputs("question", "passages")
        )
    return {"generate": out}


def self_ask_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for Self-Ask's ``ask`` and ``answer_followup`` roles (``n`` each).

    ``ask`` demos are states of gold decompositions: the first asks the first follow-up of a chain, the middle ones
    ask the next follow-up with the earlier answers written in, and the last gives the final answer once every
    intermediate answer is known.

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them).
        n: demos per role.
        seed: picks the distractor passages and where the gold passage goes.

    Returns:
        ``{"ask": [...], "answer_followup": [...]}``.
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    demos: dict[str, list[dspy.Example]] = {"ask": [], "answer_followup": []}
    chosen = select_examples(examples, n)
    for k, e in enumerate(chosen):
        steps = [(q, s.answer) for q, s in filled_steps(e)]
        final = k == len(chosen) - 1 and k > 0
        i = len(steps) if final else min(k, len(steps) - 1)
        action, text = ("final_answer", e.answer) if i == len(steps) else ("follow_up", steps[i][0])
        demos["ask"].append(
            dspy.Example(question=e.question, history=format_history(steps[:i]), action=action, text=text).with_inputs(
                "question", "history"
            )
        )
        question, step = filled_steps(e)[-1 - (k % len(steps))]
        gold, noise = gold_and_noise(corpus, step.supporting_ids, rng)
        docs = gold + noise
        rng.shuffle(docs)
        demos["answer_followup"].append(
            dspy.Example(follow_up=question, passages=demo_passages(docs), answer=step.answer).with_inputs(
                "follow_up", "passages"
            )
        )
    return demos


default_ircot_demos = built_in_demos(ircot_demos)
default_iter_retgen_demos = built_in_demos(iter_retgen_demos)
default_self_ask_demos = built_in_demos(self_ask_demos)
