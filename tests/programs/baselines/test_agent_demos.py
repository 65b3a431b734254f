"""The agents' built-in demos: ReAct's turns and episodes, Search-R1's turns, all from gold episodes."""

from __future__ import annotations

from rolecall.data.synthetic import synthetic_world
from rolecall.programs.baselines.agent_demos import (
    default_react_demos,
    default_search_r1_demos,
    react_demos,
    search_r1_demos,
)
from rolecall.programs.baselines.search_r1_actions import NO_SEARCHES_YET, SearchR1Action, parse_action
from rolecall.signatures.baselines import REACT_HISTORY_FIELD


def test_react_demos_cover_every_move_and_role():
    demos = default_react_demos()
    assert set(demos) == {"react", "extract"} and len(demos["react"]) == 3 and len(demos["extract"]) == 3
    for d in demos["react"]:
        assert set(d.inputs().keys()) == {"question", REACT_HISTORY_FIELD}
        assert set(d.labels().keys()) == {"next_thought", "next_tool_name", "next_tool_args"}
    moves = [d.next_tool_name for d in demos["react"]]
    assert moves == ["finish", "search", "search"]  # the first search nearest to the question
    assert demos["react"][2][REACT_HISTORY_FIELD] == "" and "observation_0" in demos["react"][1][REACT_HISTORY_FIELD]
    assert demos["react"][2].next_tool_args["query"] and demos["react"][0].next_tool_args == {}
    for d in demos["extract"]:
        assert set(d.labels().keys()) == {"reasoning", "answer"} and "tool_name" in d[REACT_HISTORY_FIELD]
    demos["react"].clear()
    assert len(default_react_demos()["react"]) == 3  # copies: the cache is not mutated


def test_react_demo_observations_hold_the_gold_passage():
    world = synthetic_world(seed=1, n_train=12, n_dev=2, n_test=2)
    corpus = {d.id: d for d in world.corpus}
    demos = react_demos(world.train, world.corpus, n=2)
    first = demos["react"][1]  # n=2: a finish, then a first search
    assert first.next_tool_name == "search" and first[REACT_HISTORY_FIELD] == ""
    finish = demos["react"][0]
    assert finish.next_tool_name == "finish"
    example = next(e for e in world.train if e.question == finish.question)
    first_gold = corpus[example.decomposition[0].supporting_ids[0]]
    assert first_gold.title in finish[REACT_HISTORY_FIELD]


def test_search_r1_demos_show_search_follow_up_and_answer():
    demos = default_search_r1_demos()
    assert list(demos) == ["agent"] and len(demos["agent"]) == 3
    last, follow_up, first = demos["agent"]  # the first search nearest to the question
    for d in demos["agent"]:
        assert set(d.inputs().keys()) == {"question", "interaction"}
        assert set(d.labels().keys()) == {"reasoning", "action"}
        assert parse_action(d.action).valid
    assert first.interaction == NO_SEARCHES_YET and first.action.startswith("<search>")
    assert "<information>" in follow_up.interaction and follow_up.action.startswith("<search>")
    assert last.action.startswith("<answer>") and "<think>" in last.interaction


def test_search_r1_demo_answers_and_information_come_from_the_gold_episode():
    world = synthetic_world(seed=2, n_train=12, n_dev=2, n_test=2)
    corpus = {d.id: d for d in world.corpus}
    demos = search_r1_demos(world.train, world.corpus, n=1)["agent"]
    example = next(e for e in world.train if e.question == demos[0].question)
    assert parse_action(demos[0].action) == SearchR1Action(kind="answer", content=example.answer, valid=True)
    for step in example.decomposition:
        assert corpus[step.supporting_ids[0]].title in demos[0].interaction


def test_search_r1_demos_follow_show_reasoning():
    shown, hidden = default_search_r1_demos(), default_search_r1_demos(show_reasoning=False)
    assert "<think>" in shown["agent"][0].interaction
    assert all("<think>" not in d.interaction for d in hidden["agent"])
