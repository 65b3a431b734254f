"""The direct baselines' gold path (NoRetrievalCoT, SingleStepRAG): the seed-0 synthetic world with real BM25, and a
hand-built HotpotQA-like example without a decomposition; no model: the one role is gold."""

from __future__ import annotations

import functools

import dspy
import pytest

from rolecall.data.corpus import documents_from_paragraphs
from rolecall.data.io import Paragraph
from rolecall.data.types import Example
from rolecall.optimizers.gold import direct_gold, gold_steps, gold_trajectories
from rolecall.optimizers.gold.direct import MAX_FACTS, gold_reasoning, supporting_sentences
from rolecall.programs.baselines.direct import NoRetrievalCoT, SingleStepRAG
from rolecall.programs.core.gold import gold_path
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.opera.program import OPERA
from rolecall.retrievers.bm25 import BM25
from rolecall.signatures.baselines import AnswerFromPassages
from rolecall.utils import SchemaLM

HEJORN_REASONING = (
    "Who directed the film Hejorn Orbit? Shigra Sikarndal. Which country is Shigra Sikarndal from? Kriagonia."
)


def run(program, e, corpus=None):
    ((_, pred),) = gold_trajectories(program, [e], functools.partial(direct_gold, corpus=corpus))
    return pred


def only_gold_answer_step(pred, lm):
    """The run's one role step, checked gold (no LM call) and parsing back to its outputs."""
    assert lm.calls == 0
    (step,) = pred.trajectory.role_steps()
    assert gold_steps(pred.trajectory) == [step] and step.role == "answer"
    signature = dspy.ChainOfThought(AnswerFromPassages).predict.signature
    assert dspy.ChatAdapter().parse(signature, step.completion) == step.outputs
    return step


def test_single_step_rag_on_a_compositional_synthetic_question(world, bm25):
    # "Which country is the director of the film Hejorn Orbit from?": Hejorn Orbit was directed by Shigra Sikarndal,
    # who is from Kriagonia; the reasoning is the two filled gold steps with their answers, as the demos write it.
    e = next(e for e in world.train if e.id == "synthetic-0-train-0002")
    lm = SchemaLM("from the lm")
    pred = run(SingleStepRAG(bm25, lm=lm), e, world.corpus)
    step = only_gold_answer_step(pred, lm)
    assert step.outputs == {"reasoning": HEJORN_REASONING, "answer": "Kriagonia"}
    assert step.completion == (
        f"[[ ## reasoning ## ]]\n{HEJORN_REASONING}\n\n[[ ## answer ## ]]\nKriagonia\n\n[[ ## completed ## ]]"
    )
    assert step.inputs["question"] == e.question and "Hejorn Orbit" in step.inputs["passages"]
    assert pred.answer == "Kriagonia" and len(pred.trajectory.retrievals()) == 1


def test_no_retrieval_cot_gets_the_same_gold_without_passages(world):
    e = next(e for e in world.train if e.id == "synthetic-0-train-0002")
    lm = SchemaLM()
    pred = run(NoRetrievalCoT(None, lm=lm), e)
    step = only_gold_answer_step(pred, lm)
    assert step.outputs == {"reasoning": HEJORN_REASONING, "answer": "Kriagonia"}
    assert set(step.inputs) == {"question"} and pred.answer == "Kriagonia"


def test_a_comparison_reasoning_lists_both_looked_up_values(world):
    e = next(e for e in world.train if e.id == "synthetic-0-train-0000")
    assert gold_reasoning(e) == (
        "In which year was the band Yaebroria formed? 1961. In which year was the band Traveilt Archives formed? 2010."
    )


# A HotpotQA-like example: two titled paragraphs split into sentences, supporting facts (A, 1) and (B, 0), no
# decomposition. Its sentence ids are those the HotpotQA loader writes to metadata["supporting_sentence_ids"].
ARTHUR = Paragraph.from_sentences(
    "Arthur's Magazine",
    ["Arthur's Magazine was an American literary periodical.", " It was first published in 1844.", " It ended."],
)
FIRST_FOR_WOMEN = Paragraph.from_sentences(
    "First for Women", ["First for Women is a woman's magazine launched in 1989.", " It is based in New Jersey."]
)
DISTRACTOR = Paragraph.from_sentences("Radio Times", ["Radio Times is a British magazine founded in 1923."])
PARAGRAPHS = [ARTHUR, FIRST_FOR_WOMEN, DISTRACTOR]
PARAGRAPHS_AS_DOCS = documents_from_paragraphs(PARAGRAPHS)


def hotpot_example(answer: str = "Arthur's Magazine") -> Example:
    return Example(
        id="5a7a06935542990198eaf050",
        question="Which magazine was started first Arthur's Magazine or First for Women?",
        answers=[answer] if answer else [],
        supporting_ids=[ARTHUR.id, FIRST_FOR_WOMEN.id],
        type="comparison",
        dataset="hotpotqa",
        metadata={
            "supporting_facts": [["Arthur's Magazine", 1], ["First for Women", 0]],
            "supporting_sentence_ids": [ARTHUR.sentence_id(1), FIRST_FOR_WOMEN.sentence_id(0)],
        },
    )


FACTS = "It was first published in 1844. First for Women is a woman's magazine launched in 1989."


@pytest.mark.parametrize("level", ["sentence", "paragraph"])
def test_single_step_rag_without_decomposition_reasons_from_the_supporting_sentences(level):
    corpus = documents_from_paragraphs(PARAGRAPHS, level=level)
    lm = SchemaLM("from the lm")
    pred = run(SingleStepRAG(BM25(corpus), lm=lm, top_k=2), hotpot_example(), corpus)
    step = only_gold_answer_step(pred, lm)
    assert step.outputs == {"reasoning": FACTS, "answer": "Arthur's Magazine"}
    assert step.completion == (
        f"[[ ## reasoning ## ]]\n{FACTS}\n\n[[ ## answer ## ]]\nArthur's Magazine\n\n[[ ## completed ## ]]"
    )


def test_without_decomposition_or_facts_the_reasoning_is_the_answer():
    e = hotpot_example()
    assert gold_reasoning(e) == "Arthur's Magazine"  # no corpus: the sentence texts are unknown
    e.metadata["supporting_sentence_ids"] = []
    lm = SchemaLM()
    step = only_gold_answer_step(run(NoRetrievalCoT(None, lm=lm), e, PARAGRAPHS_AS_DOCS), lm)
    assert step.outputs == {"reasoning": "Arthur's Magazine", "answer": "Arthur's Magazine"}


def test_supporting_sentences_are_capped():
    many = Paragraph.from_sentences("Many", [f"Fact number {i} is here." for i in range(10)])
    e = Example("m", "q", ["a"], metadata={"supporting_sentence_ids": [many.sentence_id(i) for i in range(10)]})
    corpus = documents_from_paragraphs([many], level="sentence")
    assert supporting_sentences(e, corpus) == [f"Fact number {i} is here." for i in range(MAX_FACTS)]
    long = Paragraph.from_sentences("Long", ["A" * 300 + ".", "B" * 300 + "."])
    e = Example("l", "q", ["a"], metadata={"supporting_sentence_ids": [long.sentence_id(0), long.sentence_id(1)]})
    assert supporting_sentences(e, documents_from_paragraphs([long], level="sentence")) == ["A" * 300 + "."]


def test_other_programs_roles_and_unanswered_examples_are_left_to_the_lm(world, bm25):
    e = next(e for e in world.train if e.id == "synthetic-0-train-0002")
    override = direct_gold(e)
    assert override(OPERA(bm25, lm=SchemaLM()), "synthesis", {}, Trajectory()) is None
    assert override(OPERA(bm25, lm=SchemaLM()), "answer", {}, Trajectory()) is None
    lm = SchemaLM("from the lm")
    program = NoRetrievalCoT(None, lm=lm)
    with gold_path(direct_gold(hotpot_example(answer=""))):
        pred = program(question="Q?")
    assert lm.calls == 1 and gold_steps(pred.trajectory) == [] and pred.answer == "from the lm"
