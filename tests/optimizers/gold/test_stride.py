"""STRIDE's gold path on hand-checked synthetic examples (seed-0 world, real BM25); no model: every role is gold."""

from __future__ import annotations

import functools

import dspy
import pytest

from rolecall.data.types import Example
from rolecall.optimizers.gold import gold_steps, gold_trajectories
from rolecall.optimizers.gold.stride import stride_gold
from rolecall.programs.core.gold import gold_path
from rolecall.programs.stride.program import STRIDE
from rolecall.utils import SchemaLM


def example(world, example_id):
    return next(e for e in world.train if e.id == example_id)


def run(program, e, corpus):
    ((_, pred),) = gold_trajectories(program, [e], functools.partial(stride_gold, corpus=corpus))
    return pred


def outputs(pred, role, key):
    return [s.outputs[key] for s in pred.trajectory.role_steps(role)]


def assert_all_gold_and_parse_back(program, pred, lm):
    """Every role step is gold (the LM was never called) and its completion parses back to its outputs."""
    assert lm.calls == 0
    roles = pred.trajectory.role_steps()
    assert roles and gold_steps(pred.trajectory) == roles
    for step in roles:
        signature = program.roles[step.role].signature
        assert set(step.outputs) == set(signature.output_fields)
        assert dspy.ChatAdapter().parse(signature, step.completion) == step.outputs


def test_a_two_hop_compositional_question_gets_every_role_gold(world, bm25):
    # "Which country is the director of the film Hejorn Orbit from?": film/hejorn-orbit names the director Shigra
    # Sikarndal, person/shigra-sikarndal says she is from Kriagonia; BM25 shows each gold passage first, so each
    # sub-question is solved by its first search: the Extractor copies the sentences holding the sub-answer.
    e = example(world, "synthetic-0-train-0002")
    lm = SchemaLM("from the lm")
    program = STRIDE(bm25, lm=lm)
    pred = run(program, e, world.corpus)
    assert outputs(pred, "meta_planner", "steps") == [
        ["Who directed the film?", "Which country is the person from step 1 from?"]
    ]
    assert outputs(pred, "planner", "sub_questions") == [
        ["Who directed the film Hejorn Orbit?", "Which country is [person from step 1] from?"]
    ]
    first, second = pred.trajectory.role_steps("supervisor")
    assert first.outputs == {"action": "retrieve", "query": "Who directed the film Hejorn Orbit?"}
    assert second.inputs["sub_question"] == "Which country is Shigra Sikarndal from?"  # filled with the gold answer
    assert second.outputs == {"action": "retrieve", "query": "Which country is Shigra Sikarndal from?"}
    assert outputs(pred, "extractor", "facts") == [
        "- Hejorn Orbit is a 1999 western film directed by Shigra Sikarndal.\n"
        "- Hejorn Orbit was the first film that Shigra Sikarndal directed.",
        "- Shigra Sikarndal is a director from Kriagonia.",
    ]
    assert outputs(pred, "reasoner", "answer") == ["Shigra Sikarndal", "Kriagonia"]
    last = pred.trajectory.role_steps("reasoner")[-1]
    assert last.inputs["facts"] == "- Shigra Sikarndal is a director from Kriagonia."  # E_2, as the program passed it
    assert last.completion == "[[ ## answer ## ]]\nKriagonia\n\n[[ ## completed ## ]]"
    assert pred.answer == e.answers[0] == "Kriagonia" and pred.trajectory.role_steps("fallback") == []
    assert_all_gold_and_parse_back(program, pred, lm)


def test_an_intersection_is_answered_from_the_facts_already_in_the_state(world, bm25):
    # Step 3 "Which person is in both #1 and #2?" is supported by the two film passages steps 1 and 2 already
    # extracted, and Stovas Thujelsk is in both cast lists: the Supervisor answers without a search.
    e = example(world, "synthetic-0-train-0001")
    lm = SchemaLM()
    program = STRIDE(bm25, lm=lm)
    pred = run(program, e, world.corpus)
    assert outputs(pred, "supervisor", "action") == ["retrieve", "retrieve", "answer"]
    assert len(pred.trajectory.retrievals()) == 2
    final = pred.trajectory.role_steps("reasoner")[-1]
    assert final.inputs["facts"].splitlines()[:2] == [
        "- Its cast includes Stovas Thujelsk, Lasys Fanane and Haepa Liaraevmar.",
        "- Its cast includes Stovas Thujelsk, Fatelle Maemdal and Hiadia Krornane.",
    ]
    assert final.outputs == {"answer": "Stovas Thujelsk"} and pred.answer == "Stovas Thujelsk"
    assert_all_gold_and_parse_back(program, pred, lm)


def test_a_comparison_ends_with_a_reasoning_step_the_supervisor_answers(world, bm25):
    e = example(world, "synthetic-0-train-0000")  # Which band was formed earlier, Yaebroria or Traveilt Archives?
    lm = SchemaLM()
    program = STRIDE(bm25, lm=lm)
    pred = run(program, e, world.corpus)
    assert outputs(pred, "meta_planner", "steps")[0][-1] == "Compare the answers of steps 1 and 2."
    *_, compare = pred.trajectory.role_steps("supervisor")
    filled = "Given 1961 and 2010: Which band was formed earlier, Yaebroria or Traveilt Archives?"
    assert compare.inputs["sub_question"] == filled
    assert compare.outputs == {"action": "answer", "query": filled}
    assert outputs(pred, "reasoner", "answer") == ["1961", "2010", "Yaebroria"] and pred.answer == "Yaebroria"
    assert_all_gold_and_parse_back(program, pred, lm)


def test_a_gold_passage_not_shown_gives_no_facts_then_a_rewrite_with_its_title(world, bm25):
    # "In which year was Pekim Sansk born?": person/pekim-sansk is fourth of k = 5 and the passage budget shows three,
    # so the Extractor says none; the next round rewrites with the passage's title, which shows it third.
    e = example(world, "synthetic-0-train-0012")
    lm = SchemaLM()
    program = STRIDE(bm25, lm=lm)
    pred = run(program, e, world.corpus)
    first_search = pred.trajectory.retrievals()[0]
    assert first_search.outputs["passage_ids"][3] == "person/pekim-sansk"
    extractions = pred.trajectory.role_steps("extractor")
    assert extractions[0].inputs["passages"].count("\n") == 2 and extractions[0].outputs == {"facts": "none"}
    rewrite = next(s for s in pred.trajectory.role_steps("supervisor") if s.outputs["action"] == "rewrite")
    assert rewrite.inputs["failed_queries"] == "In which year was Pekim Sansk born?"
    assert rewrite.outputs == {"action": "rewrite", "query": "Pekim Sansk"}
    assert extractions[2].outputs == {"facts": "- Pekim Sansk was born in 1912 in Dropavel."}
    assert outputs(pred, "reasoner", "answer") == ["1854", "1912", "Zuda Yourssen"] and pred.answer == "Zuda Yourssen"
    assert_all_gold_and_parse_back(program, pred, lm)


def test_a_passage_cut_from_the_first_prompt_is_shown_first_on_the_rewrite(world, bm25):
    # person/trabryn-fefelmar ranks fifth for every query and does not fit the first prompt; the rewrite shows the
    # passages not shown yet first, so the second attempt sees it and the sub-question is answered.
    e = example(world, "synthetic-0-train-0027")
    lm = SchemaLM()
    program = STRIDE(bm25, lm=lm)
    pred = run(program, e, world.corpus)
    queries = outputs(pred, "supervisor", "query")
    assert queries[:2] == ["Who is the spouse of Trabryn Fefelmar?", "Trabryn Fefelmar"]
    facts = outputs(pred, "extractor", "facts")
    assert facts[0] == "none" and facts[1] != "none"
    shown = [s.meta["shown_ids"] for s in pred.trajectory.retrievals()][:2]
    assert "person/trabryn-fefelmar" not in shown[0] and "person/trabryn-fefelmar" in shown[1]
    events = [s.role for s in pred.trajectory.steps if s.kind == "event"]
    assert "budget_exhausted" not in events and pred.answer == "Paman Drochornov"
    assert_all_gold_and_parse_back(program, pred, lm)


def test_without_the_extractor_the_reasoner_says_unknown_when_the_gold_passage_is_not_shown(world, bm25):
    e = example(world, "synthetic-0-train-0012")
    lm = SchemaLM()
    program = STRIDE(bm25, lm=lm, use_extractor=False)
    pred = run(program, e, world.corpus)
    assert outputs(pred, "reasoner", "answer") == ["unknown", "1854", "1912", "Zuda Yourssen"]
    assert pred.answer == "Zuda Yourssen"
    assert_all_gold_and_parse_back(program, pred, lm)


@pytest.mark.parametrize("ablation", ["use_meta_planner", "use_supervisor", "use_fallback"])
def test_the_ablations_run_their_remaining_roles_gold(world, bm25, ablation):
    e = example(world, "synthetic-0-train-0006")  # bridge comparison: four gold steps and a reasoning step
    lm = SchemaLM()
    program = STRIDE(bm25, lm=lm, **{ablation: False})
    pred = run(program, e, world.corpus)
    assert pred.answer == "Qufo Meridian"
    assert_all_gold_and_parse_back(program, pred, lm)


def test_without_a_corpus_only_the_meta_planner_is_left_to_the_lm(world, bm25):
    e = example(world, "synthetic-0-train-0002")
    lm = SchemaLM()
    pred = run(STRIDE(bm25, lm=lm), e, None)
    assert lm.calls == 1 and not pred.trajectory.role_steps("meta_planner")[0].meta.get("gold")
    assert outputs(pred, "planner", "sub_questions") == [
        ["Who directed the film Hejorn Orbit?", "Which country is [entity from step 1] from?"]
    ]
    assert [s.role for s in gold_steps(pred.trajectory)] == ["planner"] + ["supervisor", "extractor", "reasoner"] * 2
    assert pred.answer == "Kriagonia"


def test_what_no_gold_step_matches_is_left_to_the_lm(world, bm25):
    e = example(world, "synthetic-0-train-0002")
    lm = SchemaLM()
    with gold_path(stride_gold(e, corpus=world.corpus)):
        pred = STRIDE(bm25, lm=lm).execute_plan(e.question, ["Director of Hejorn Orbit?"])
    # the LM ("unknown") answers the unmatched sub-question, so the plan stays unfinished: the Fallback is gold
    assert [s.role for s in gold_steps(pred.trajectory)] == ["fallback"] and lm.calls > 0
    assert not any(s.meta.get("gold") for s in pred.trajectory.role_steps("supervisor")) and pred.answer == "Kriagonia"
    no_gold = Example("x", e.question, e.answers)  # without a gold decomposition nothing is gold
    assert (
        stride_gold(no_gold, world.corpus)(STRIDE(bm25), "planner", {"question": e.question}, pred.trajectory) is None
    )


def test_the_runner_keeps_each_examples_override_across_threads(world, bm25):
    examples = world.train[:8]
    lm = SchemaLM()
    runs = gold_trajectories(
        STRIDE(bm25, lm=lm), examples, functools.partial(stride_gold, corpus=world.corpus), num_threads=3
    )
    assert [e.id for e, _ in runs] == [e.id for e in examples]
    assert all(pred.answer == e.answers[0] for e, pred in runs) and lm.calls == 0
    assert all(gold_steps(p.trajectory) == p.trajectory.role_steps() for _, p in runs)
