"""Tests for the gold decompositions rolecall.data.twowiki builds from 2WikiMultihopQA's evidence triples."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from rolecall.data.twowiki import decomposition_from_evidences, load_twowiki, relation_question, same_entity
from rolecall.data.types import Example, SubStep, doc_id

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
TWOWIKI = DATA / "2wikimultihopqa" / "2wiki_dev_243.json"


def load_one(tmp_path: Path, **record: Any) -> Example:
    """Load one official-layout record (``context`` given as ``{title: [sentences]}`` for brevity)."""
    rec = {"_id": "w", "answer": "A", **record}
    rec["context"] = [[title, sentences] for title, sentences in record["context"].items()]
    path = tmp_path / "d.json"
    path.write_text(json.dumps([rec]), encoding="utf-8")
    (ex,) = load_twowiki(path)
    return ex


def pid(title: str, *sentences: str) -> str:
    return doc_id(title, " ".join(sentences))


def test_relation_questions_and_the_generic_fallback() -> None:
    assert relation_question("father", "Charles Mathew") == "Who is the father of Charles Mathew?"
    assert relation_question("place of burial", "#1") == "What is the place of burial of #1?"
    assert relation_question("date of birth", "#2") == "When was #2 born?"
    assert relation_question("head coach", "Ajax") == "What is the head coach of Ajax?"


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("Charles Howard, 1st Earl of Carlisle", "Charles Howard", True),  # words of one begin the other
        ("Frank McDonald (director)", "Frank McDonald", True),  # a disambiguating parenthetical
        ("Nina Companéez", "Nina Companeez", True),  # accents
        ("Harnam Singh Rawail", "H. S. Rawail", True),  # initials
        ("Bahram Beyzai", "Bahram Bayzai", True),  # a close spelling
        ("Cork", "Dublin", False),
        ("Anatole Litvak", "Sidney Olcott", False),
    ],
)
def test_same_entity(a: str, b: str, same: bool) -> None:
    assert same_entity(a, b) is same


def test_compositional_chain_with_a_renamed_first_entity(tmp_path: Path) -> None:
    # The evidences call the man "Charles James Mathew", his paragraph and the question "Charles Mathew"; the second
    # subject names step 1's object, so it becomes #1. Supporting facts come in evidence order, so the first subject
    # gets the first gold paragraph even though no title equals it.
    ex = load_one(
        tmp_path,
        type="compositional",
        question="Where was the place of burial of Charles Mathew's father?",
        answer="Cork",
        context={
            "James Charles Mathew": ["Sir James Charles Mathew was a judge.", "He was buried in Cork."],
            "Charles Mathew": ["Charles James Mathew was a barrister.", "His father was Sir James Charles Mathew."],
            "Cork": ["Cork is a city."],
        },
        supporting_facts=[["Charles Mathew", 1], ["James Charles Mathew", 1]],
        evidences=[
            ["Charles James Mathew", "father", "Sir James Charles Mathew"],
            ["Sir James Charles Mathew", "place of burial", "Cork"],
        ],
    )
    assert ex.decomposition == [
        SubStep(
            "Who is the father of Charles Mathew?",
            "Sir James Charles Mathew",
            [
                pid(
                    "Charles Mathew",
                    "Charles James Mathew was a barrister.",
                    "His father was Sir James Charles Mathew.",
                )
            ],
        ),
        SubStep(
            "What is the place of burial of #1?",
            "Cork",
            [pid("James Charles Mathew", "Sir James Charles Mathew was a judge.", "He was buried in Cork.")],
        ),
    ]


def test_inference_links_a_shortened_name_to_the_earlier_object(tmp_path: Path) -> None:
    ex = load_one(
        tmp_path,
        type="inference",
        question="Who is Edward Howard, 2Nd Earl Of Carlisle's paternal grandfather?",
        answer="Sir William Howard",
        context={
            "Edward Howard, 2nd Earl of Carlisle": ["His father was Charles Howard, 1st Earl of Carlisle."],
            "Charles Howard, 1st Earl of Carlisle": ["His father was Sir William Howard."],
        },
        supporting_facts=[["Edward Howard, 2nd Earl of Carlisle", 0], ["Charles Howard, 1st Earl of Carlisle", 0]],
        evidences=[
            ["Edward Howard, 2nd Earl of Carlisle", "father", "Charles Howard, 1st Earl of Carlisle"],
            ["Charles Howard", "father", "Sir William Howard"],
        ],
    )
    assert [(s.question, s.answer) for s in ex.decomposition] == [
        ("Who is the father of Edward Howard, 2nd Earl of Carlisle?", "Charles Howard, 1st Earl of Carlisle"),
        ("Who is the father of #1?", "Sir William Howard"),
    ]
    assert ex.decomposition[-1].answer == ex.answer
    assert [i for s in ex.decomposition for i in s.supporting_ids] == ex.supporting_ids


def test_bridge_comparison_is_ordered_level_by_level(tmp_path: Path) -> None:
    # Evidences side by side (A's director, his birth, B's director, his birth) become the synthetic world's
    # layout: both bridge look-ups first (#1, #2), then each bridge's value; the director's paragraph title carries a
    # parenthetical the evidence drops, and there is no final comparison step.
    context = {
        "Target Zero": ["Target Zero is a 1955 film directed by Harmon Jones."],
        "Midnight Court (film)": ["Midnight Court is a 1937 film directed by Frank McDonald."],
        "Harmon Jones": ["Harmon Jones was born on June 3, 1911."],
        "Frank McDonald (director)": ["Frank McDonald was born on November 9, 1899."],
    }
    ex = load_one(
        tmp_path,
        type="bridge_comparison",
        question="Which film has the director born later, Target Zero or Midnight Court (Film)?",
        answer="Target Zero",
        context=context,
        supporting_facts=[[title, 0] for title in context],
        evidences=[
            ["Target Zero", "director", "Harmon Jones"],
            ["Harmon Jones", "date of birth", "June 3, 1911"],
            ["Midnight Court (film)", "director", "Frank McDonald (director)"],
            ["Frank McDonald", "date of birth", "November 9, 1899"],
        ],
    )
    ids = {title: pid(title, *sentences) for title, sentences in context.items()}
    assert ex.decomposition == [
        SubStep("Who directed Target Zero?", "Harmon Jones", [ids["Target Zero"]]),
        SubStep("Who directed Midnight Court (film)?", "Frank McDonald (director)", [ids["Midnight Court (film)"]]),
        SubStep("When was #1 born?", "June 3, 1911", [ids["Harmon Jones"]]),
        SubStep("When was #2 born?", "November 9, 1899", [ids["Frank McDonald (director)"]]),
    ]


def test_comparison_with_two_values_of_one_relation_is_one_step(tmp_path: Path) -> None:
    ex = load_one(
        tmp_path,
        type="comparison",
        question="Do the movies Touch Of Pink and The Head Of The Family, originate from the same country?",
        answer="yes",
        context={"Touch of Pink": ["A Canadian-British film."], "The Head of the Family": ["A British film."]},
        supporting_facts=[["Touch of Pink", 0], ["The Head of the Family", 0]],
        evidences=[
            ["Touch of Pink", "country of origin", "Canadian"],
            ["Touch of Pink", "country of origin", "British"],
            ["The Head of the Family", "country of origin", "British"],
        ],
    )
    assert [(s.question, s.answer) for s in ex.decomposition] == [
        ("Which country is Touch of Pink from?", "Canadian and British"),
        ("Which country is The Head of the Family from?", "British"),
    ]


def test_a_subject_without_a_paragraph_gets_no_supporting_id() -> None:
    steps = decomposition_from_evidences([["Nowhere Film", "director", "Ann Vole"]], "compositional")
    assert steps == [SubStep("Who directed Nowhere Film?", "Ann Vole", [])]


@pytest.mark.parametrize("evidences", [[], [["X", "father"]], [["X", "father", 3]], [["X", " ", "Y"]], ["X father Y"]])
def test_missing_or_malformed_evidences_keep_no_decomposition(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, evidences: list[Any]
) -> None:
    with caplog.at_level(logging.DEBUG, logger="rolecall.data.twowiki"):
        ex = load_one(tmp_path, type="compositional", question="Q?", context={"X": ["X."]}, evidences=evidences)
    assert ex.decomposition is None and "no gold decomposition" in caplog.text


# ---------------------------------------------------------------------------------------------------------------------
# The real dev subset: every record gets a decomposition consistent with its answer.
# ---------------------------------------------------------------------------------------------------------------------
_MONTHS = "january february march april may june july august september october november december".split()


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    if not TWOWIKI.is_file():
        pytest.skip(f"real 2WikiMultihopQA subset not found at {TWOWIKI} (the shared data folder is absent)")
    return load_twowiki(TWOWIKI)


def _date(text: str) -> tuple[int, int, int]:
    """(year, month, day) of ``"3 July 1640"`` / ``"July 3, 1640"`` / ``"1640"`` (0 where absent)."""
    lower = text.lower()
    month = next((i + 1 for i, m in enumerate(_MONTHS) if m in lower), 0)
    day = re.findall(r"\b(\d{1,2})\b", lower)
    return int(re.findall(r"\d{3,4}", lower)[-1]), month, int(day[0]) if day else 0


def _sides(steps: list[SubStep]) -> dict[str, list[SubStep]]:
    """Each compared entity (its first step's paragraph title) -> its steps that no later step refers to."""
    side: dict[int, str] = {}
    for k, s in enumerate(steps, start=1):
        ref = re.search(r"#(\d+)", s.question)
        side[k] = side[int(ref.group(1))] if ref else s.supporting_ids[0].split("::")[0]
    leaves: dict[str, list[SubStep]] = {}
    for k, s in enumerate(steps, start=1):
        if not any(f"#{k}" in t.question for t in steps):
            leaves.setdefault(side[k], []).append(s)
    return leaves


def _comparison_winner(question: str, sides: dict[str, list[SubStep]]) -> str:
    """The compared entity the question's direction picks from the compared dates."""
    q = question.lower()
    if "lived longer" in q:
        return max(sides, key=lambda n: _date(sides[n][1].answer)[0] - _date(sides[n][0].answer)[0])
    dates = {n: _date(steps[0].answer) for n, steps in sides.items()}
    if re.search(r"\b(earlier|first|older)\b", q):
        return min(dates, key=dates.__getitem__)
    assert re.search(r"\b(later|recently|younger)\b", q), question
    return max(dates, key=dates.__getitem__)


def test_real_every_record_has_a_decomposition_consistent_with_its_answer(examples: list[Example]) -> None:
    # Measured on the 243-record dev subset: 126/126 chains end on the answer; of 117 comparisons, 97 name one of the
    # compared entities and the compared dates pick it, and 20 yes/no answers agree with equality of the values.
    assert all(e.decomposition for e in examples)
    for e in examples:
        steps = e.decomposition
        assert all(s.question.endswith("?") and s.answer for s in steps), e.id
        assert {i for s in steps for i in s.supporting_ids} == set(e.supporting_ids), e.id
        if e.type in ("compositional", "inference"):
            assert same_entity(steps[-1].answer, e.answer), (e.question, steps[-1].answer, e.answer)
            assert all(f"#{k}" in s.question for k, s in enumerate(steps[1:], start=1)), e.id
            continue
        sides = _sides(steps)
        assert len(sides) == 2, e.id
        if e.answer in ("yes", "no"):
            values = [{v for s in leaves for v in re.split(r", | and ", s.answer)} for leaves in sides.values()]
            assert bool(values[0] & values[1]) == (e.answer == "yes"), e.question
        else:
            assert same_entity(_comparison_winner(e.question, sides), e.answer), e.question
