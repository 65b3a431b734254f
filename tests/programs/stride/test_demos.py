"""STRIDE's built-in demos: the gold Concrete Plan and General Strategy of an example, and one demo set per role."""

from __future__ import annotations

from rolecall.data.types import Document, Example, SubStep
from rolecall.programs.stride.demos import default_stride_demos, gold_plan, gold_strategy


def test_gold_plan_and_strategy_for_a_comparison():
    corpus = {
        "film/a": Document("film/a", "Heimim Orchard", "Heimim Orchard is a 1948 film."),
        "film/b": Document("film/b", "The Gilded Thegam", "The Gilded Thegam is a 1979 film."),
    }
    example = Example(
        "x",
        "Which film came out earlier, Heimim Orchard or The Gilded Thegam?",
        ["Heimim Orchard"],
        decomposition=[
            SubStep("In which year was the film Heimim Orchard released?", "1948", ["film/a"]),
            SubStep("In which year was the film The Gilded Thegam released?", "1979", ["film/b"]),
        ],
    )
    assert gold_plan(example, corpus)[-1] == (
        "Given [year from step 1] and [year from step 2]: "
        "Which film came out earlier, Heimim Orchard or The Gilded Thegam?"
    )
    assert gold_strategy(example, corpus) == [
        "In which year was the film released?",
        "In which year was the film released?",
        "Compare the answers of steps 1 and 2.",
    ]


def test_every_role_gets_demos_with_its_fields():
    demos = default_stride_demos()
    assert list(demos) == ["meta_planner", "planner", "supervisor", "extractor", "reasoner", "fallback"]
    assert all(2 <= len(d) <= 3 for d in demos.values())
    assert all(set(d.toDict()) == {"question", "steps"} and d.steps for d in demos["meta_planner"])
    for strategist, planner in zip(demos["meta_planner"], demos["planner"], strict=True):
        assert set(planner.inputs().keys()) == {"question", "strategy"} and planner.strategy == strategist.steps
        assert len(planner.sub_questions) == len(planner.strategy)  # one sub-question per strategy step
    for demo in demos["fallback"]:  # P_q: the strategy, then the sub-questions with their answers or pending
        strategy, _, plan = demo.plan.partition("\nPlan:\n")
        assert strategy.startswith("Strategy:\n1. ") and plan.splitlines()[-1].endswith("-> pending")
    demos["planner"][0].question = "changed"
    assert default_stride_demos()["planner"][0].question != "changed"
