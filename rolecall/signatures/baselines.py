"""Role signatures of the baselines every paper compares against (PAPERS.md, "Baselines"): closed-book CoT,
single-step RAG, the iterative retrieval baselines (IRCoT, Iter-RetGen, Self-Ask) and the two agents (ReAct's task
signature, the Search-R1-style agent's turn). The Search-R1 action parser lives with its program
(:mod:`rolecall.programs.baselines.search_r1_actions`)."""

from __future__ import annotations

from typing import Literal

import dspy

__all__ = [
    "AnswerQuestion",
    "AnswerFromPassages",
    "NextReasoningSentence",
    "AnswerFromReasoning",
    "GenerateWithPassages",
    "SelfAskAction",
    "AskFollowUp",
    "AnswerFollowUp",
    "ReActQuestion",
    "REACT_HISTORY_FIELD",
    "SearchR1Turn",
]


class AnswerQuestion(dspy.Signature):
    """Answer the question. Give only the short answer."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a few words")


class AnswerFromPassages(dspy.Signature):
    """Answer the question using the passages. Give only the short answer."""

    question: str = dspy.InputField()
    passages: str = dspy.InputField(desc="retrieved passages")
    answer: str = dspy.OutputField(desc="a few words")


# ---------------------------------------------------------------------------------------------------------------------
# IRCoT (Trivedi et al., ACL 2023): one chain-of-thought sentence per call, each sentence the next retrieval query.
# ---------------------------------------------------------------------------------------------------------------------
class NextReasoningSentence(dspy.Signature):
    """Write the next sentence of step-by-step reasoning toward the answer, using a fact from the passages.
    When the reasoning so far is enough, end with: So the answer is <answer>."""

    question: str = dspy.InputField()
    passages: str = dspy.InputField(desc="retrieved passages")
    reasoning: str = dspy.InputField(desc="sentences written so far")
    next_sentence: str = dspy.OutputField(desc="one sentence")


class AnswerFromReasoning(dspy.Signature):
    """Give the short answer to the question that the reasoning and passages support."""

    question: str = dspy.InputField()
    passages: str = dspy.InputField(desc="retrieved passages")
    reasoning: str = dspy.InputField(desc="step-by-step reasoning")
    answer: str = dspy.OutputField(desc="a few words")


# ---------------------------------------------------------------------------------------------------------------------
# Iter-RetGen (Shao et al., Findings of EMNLP 2023): the generator, run once per retrieval-generation iteration.
# ---------------------------------------------------------------------------------------------------------------------
class GenerateWithPassages(dspy.Signature):
    """Reason over the passages step by step, then give the short answer to the question."""

    question: str = dspy.InputField()
    passages: str = dspy.InputField(desc="retrieved passages")
    answer: str = dspy.OutputField(desc="a few words")


# ---------------------------------------------------------------------------------------------------------------------
# Self-Ask (Press et al., Findings of EMNLP 2023) with retrieval answering the follow-up questions.
# ---------------------------------------------------------------------------------------------------------------------
SelfAskAction = Literal["follow_up", "final_answer"]
"""What the Self-Ask model does next: ask another follow-up question, or give the final answer."""


class AskFollowUp(dspy.Signature):
    """Solve the question one follow-up question at a time. If a fact is still missing, choose follow_up and ask one
    simple question that names the entity. If the intermediate answers are enough, choose final_answer and answer."""

    question: str = dspy.InputField()
    history: str = dspy.InputField(desc="follow-up questions so far with their intermediate answers")
    action: SelfAskAction = dspy.OutputField()
    text: str = dspy.OutputField(desc="the follow-up question, or the final answer in a few words")


class AnswerFollowUp(dspy.Signature):
    """Answer the simple question from the passages. Give only the short answer, or unknown."""

    follow_up: str = dspy.InputField(desc="a simple question")
    passages: str = dspy.InputField(desc="retrieved passages")
    answer: str = dspy.OutputField(desc="a few words")


# ---------------------------------------------------------------------------------------------------------------------
# ReAct (Yao et al., ICLR 2023) as dspy.ReAct runs it: the task signature its react / extract roles are built from.
# ---------------------------------------------------------------------------------------------------------------------
class ReActQuestion(dspy.Signature):
    """Answer the multi-hop question. Search for one fact at a time, using what earlier searches found, and finish
    once the passages name the answer. Give only the short answer."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a few words")


REACT_HISTORY_FIELD = "past_trajectory"
"""Name of the input field that holds ReAct's formatted trajectory in rolecall's ReAct roles.

``dspy.ReAct`` calls it ``trajectory``; ``Program.call_role(role, trajectory, **inputs)`` already takes a parameter
of that name (the rolecall ``Trajectory``), so the field is renamed when the roles are built."""


# ---------------------------------------------------------------------------------------------------------------------
# Search-R1 (Jin et al., arXiv 2503.09516): one turn of the single agent. ``reasoning`` holds the <think> text and
# ``action`` exactly one <search>query</search> or <answer>answer</answer> tag; the program inserts the results as
# <information>...</information>.
# ---------------------------------------------------------------------------------------------------------------------
class SearchR1Turn(dspy.Signature):
    """Answer the question by searching a corpus. First think about what you know and what is missing. Then act with
    exactly one tag: <search>query</search> to look something up (the results come back inside
    <information>...</information>), or <answer>short answer</answer> once the information names the answer."""

    question: str = dspy.InputField()
    interaction: str = dspy.InputField(desc="your earlier searches and the information they returned")
    reasoning: str = dspy.OutputField(desc="what is known so far and what is still missing")
    action: str = dspy.OutputField(desc="exactly one <search>query</search> or <answer>answer</answer>")
