"""2WikiMultihopQA loader (Ho et al., COLING 2020, https://github.com/Alab-NII/2wikimultihop).

The official release is a JSON list of ``{_id, type, question, context, supporting_facts, evidences, answer}`` in
HotpotQA's original layout (``context: [[title, [sentences]]]``, ``supporting_facts: [[title, sent_id]]``), so the
paragraph and gold-id rules are those of :mod:`rolecall.data.hotpotqa`. JSONL files with the same records also load.

**Hops.** The paper's four types need 2 paragraphs (``comparison``, ``compositional``, ``inference``) or 4
(``bridge_comparison``: two bridge hops, then a comparison). ``hops`` is the number of distinct supporting titles,
which equals that convention on the official dev set but stays right for any record that departs from it; the type
table is the fallback when a record has no supporting facts.

**Gold decomposition.** Each record's ``evidences`` triples ``[subject, relation, object]`` become one
:class:`~rolecall.data.types.SubStep` per ``(subject, relation)`` (a relation with several objects, such as two
nationalities, is one step whose answer lists them: ``"American and Russian"``). The sub-question comes from
:data:`RELATION_QUESTIONS` (else ``"What is the <relation> of <subject>?"``); a subject that names an earlier step's
object is written ``#k``. Steps are ordered level by level like the synthetic world's comparisons
(:mod:`rolecall.data.synthetic.comparisons`): the look-ups on the compared entities first (``#1``, ``#2``), then the
look-ups on their answers, and no final comparison step, so a ``comparison`` or ``bridge_comparison`` answer is read
off the compared values while a ``compositional`` or ``inference`` chain ends on the answer. A step's supporting id is
the gold paragraph whose title is its subject: the same title up to case, accents and a parenthetical, else the gold
paragraph in the same position (2Wiki lists its supporting facts in evidence order, which puts ``"Charles James
Mathew"``'s paragraph, titled ``"Charles Mathew"``, first), else a close title; empty when none fits. A compared or
first entity is named as its paragraph's title when the question uses that title. Records whose evidences are missing
or malformed keep ``decomposition=None``.
"""

from __future__ import annotations

import difflib
import logging
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolecall.data.hotpotqa import parse_context, parse_supporting_facts, supporting_ids_from_facts
from rolecall.data.io import Paragraph, Where, field, gold_answer, iter_records, load_examples, string_list
from rolecall.data.types import Example, SubStep

__all__ = [
    "load_twowiki",
    "iter_paragraphs",
    "HOPS_BY_TYPE",
    "RELATION_QUESTIONS",
    "relation_question",
    "same_entity",
    "decomposition_from_evidences",
]

logger = logging.getLogger(__name__)

HOPS_BY_TYPE: dict[str, int] = {"comparison": 2, "compositional": 2, "inference": 2, "bridge_comparison": 4}
"""Paragraphs each 2WikiMultihopQA question type needs (Ho et al. 2020, Section 3); the fallback for ``hops``."""

_ALIAS_KEYS = ("answer_aliases", "aliases")

RELATION_QUESTIONS: dict[str, str] = {
    "director": "Who directed {x}?",
    "date of birth": "When was {x} born?",
    "date of death": "When did {x} die?",
    "place of birth": "Where was {x} born?",
    "place of death": "Where did {x} die?",
    "father": "Who is the father of {x}?",
    "mother": "Who is the mother of {x}?",
    "spouse": "Who is the spouse of {x}?",
    "child": "Who is a child of {x}?",
    "sibling": "Who is a sibling of {x}?",
    "country of citizenship": "What is the nationality of {x}?",
    "country of origin": "Which country is {x} from?",
    "country": "Which country is {x} located in?",
    "publication date": "When was {x} released?",
    "inception": "When was {x} founded?",
    "performer": "Who performed {x}?",
    "composer": "Who composed the music of {x}?",
    "educated at": "Where was {x} educated?",
    "award received": "Which award did {x} receive?",
    "employer": "Who was the employer of {x}?",
    "publisher": "Who published {x}?",
    "producer": "Who produced {x}?",
    "screenwriter": "Who wrote the screenplay of {x}?",
    "founded by": "Who founded {x}?",
    "cast member": "Who starred in {x}?",
    "occupation": "What was the occupation of {x}?",
}
"""Sub-question templates of the relations in 2WikiMultihopQA's evidences (``{x}``: the subject or ``#k``); any other
relation gets ``"What is the <relation> of <subject>?"`` (``"place of burial"`` among them)."""

_PARENTHETICAL = re.compile(r"\([^)]*\)")
_NON_WORD = re.compile(r"[^\w]+")


def relation_question(relation: str, subject: str) -> str:
    """The sub-question asking for ``relation`` of ``subject`` (a name or a ``#k`` reference).

    Example:
        >>> relation_question("father", "Charles Mathew"), relation_question("place of burial", "#1")
        ('Who is the father of Charles Mathew?', 'What is the place of burial of #1?')
    """
    template = RELATION_QUESTIONS.get(relation.strip().casefold())
    return template.format(x=subject) if template else f"What is the {relation.strip()} of {subject}?"


def _norm(name: str) -> str:
    """Lower case, accents, parentheticals and punctuation removed: ``"Nina Companéez (director)"`` -> ``"nina
    companeez"``."""
    decomposed = unicodedata.normalize("NFKD", _PARENTHETICAL.sub(" ", name))
    plain = "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()
    return " ".join(_NON_WORD.sub(" ", plain).replace("_", " ").split())


def _match_score(a: str, b: str) -> int:
    """How surely two names denote one entity: 3 same up to case, accents, punctuation and a parenthetical; 2 one's
    words begin the other's (``"Charles Howard"``, ``"Charles Howard, 1st Earl of Carlisle"``) or initials agree
    (``"H. S. Rawail"``, ``"Harnam Singh Rawail"``); 1 a close spelling (``"Bahram Bayzai"``, ``"Bahram Beyzai"``);
    0 different."""
    na, nb = _norm(a), _norm(b)
    if not na or not nb:
        return 0
    if na == nb:
        return 3
    ta, tb = na.split(), nb.split()
    short, long = sorted((ta, tb), key=len)
    if long[: len(short)] == short:
        return 2
    if len(ta) == len(tb) > 1 and ta[-1] == tb[-1]:
        pairs = list(zip(ta[:-1], tb[:-1], strict=True))
        if all(x[0] == y[0] and (x == y or min(len(x), len(y)) == 1) for x, y in pairs):
            return 2
    ca, cb = na.replace(" ", ""), nb.replace(" ", "")
    if min(len(ca), len(cb)) >= 4 and (ca.startswith(cb) or cb.startswith(ca)):
        return 1
    return 1 if difflib.SequenceMatcher(None, ca, cb).ratio() >= 0.85 else 0


def same_entity(a: str, b: str) -> bool:
    """Whether two names from one record denote the same entity (2Wiki spells one entity several ways).

    Example:
        >>> same_entity("Frank McDonald (director)", "Frank McDonald"), same_entity("Cork", "Dublin")
        (True, False)
    """
    return _match_score(a, b) > 0


def _clean_name(name: str) -> str:
    """``name`` stripped, without an unbalanced quote at either end (``'"Greatest Love'`` -> ``'Greatest Love'``)."""
    name = name.strip()
    if name.count('"') % 2:
        name = name.strip('"').strip()
    return name


@dataclass
class _Group:
    """The evidences of one (subject, relation): one gold step."""

    subject: str
    relation: str
    objects: list[str]
    parent: int | None = None  # index of the group whose object the subject names

    @property
    def answer(self) -> str:
        names = list(dict.fromkeys(o.strip() for o in self.objects))
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _groups(evidences: Sequence[object]) -> list[_Group] | None:
    """The evidences merged by (subject, relation) in first-seen order, or None when one is not three strings."""
    groups: dict[tuple[str, str], _Group] = {}
    for triple in evidences:
        if not (
            isinstance(triple, list | tuple)
            and len(triple) == 3
            and all(isinstance(t, str) and t.strip() for t in triple)
        ):
            return None
        subject, relation, obj = triple
        key = (_norm(subject) or subject.strip(), relation.strip().casefold())
        groups.setdefault(key, _Group(subject, relation.strip(), [])).objects.append(obj)
    return list(groups.values())


def _link(groups: list[_Group], qtype: str) -> None:
    """Set each group's ``parent``: the nearest earlier group whose object best matches its subject. A subject seen
    before (a second relation of one entity) shares that group's parent. Where no name matches, the dataset's shape
    decides: a chain for ``compositional``/``inference``, one bridge per compared entity for ``bridge_comparison``."""
    for i, g in enumerate(groups):
        seen = next((h for h in groups[:i] if _match_score(g.subject, h.subject) == 3), None)
        if seen is not None:
            g.parent = seen.parent
            continue
        scores = [(max(_match_score(g.subject, o) for o in h.objects), j) for j, h in enumerate(groups[:i])]
        best = max((score for score, _ in scores), default=0)
        if best > 0:
            g.parent = max(j for score, j in scores if score == best)
            continue
        roots = [j for j, h in enumerate(groups[:i]) if h.parent is None]
        if i and qtype in ("compositional", "inference"):
            g.parent = i - 1
        elif qtype == "bridge_comparison" and len(roots) >= 2:
            used = {h.parent for h in groups[:i]}
            g.parent = next((r for r in roots if r not in used), None)
        if g.parent is not None:
            logger.debug("evidence subject %r names no earlier object; linked to step %d by shape", g.subject, g.parent)


def _level(groups: list[_Group], i: int) -> int:
    parent = groups[i].parent
    return 0 if parent is None else 1 + _level(groups, parent)


class _TitleIds:
    """Which paragraph id each evidence subject's step cites (see the module docstring for the rules)."""

    def __init__(self, paragraphs: Sequence[Paragraph], supporting_ids: Sequence[str], subjects: list[str]) -> None:
        by_id = {p.id: p for p in paragraphs}
        gold = [by_id[i] for i in supporting_ids if i in by_id]
        self.gold = {p.title: p.id for p in reversed(gold)}  # first paragraph of each title wins
        self.titles = list(dict.fromkeys(p.title for p in gold))
        self.context = {p.title: p.id for p in reversed(paragraphs)}
        self.title_of = {p.id: p.title for p in paragraphs}
        self.subjects = list(dict.fromkeys(_norm(s) for s in subjects))
        self.exact = {s: self._exact(s) for s in self.subjects}

    def _exact(self, norm_subject: str) -> str | None:
        return next((t for t in self.titles if _norm(t) == norm_subject), None)

    def ids(self, subject: str) -> list[str]:
        """``[paragraph id]`` of ``subject``'s paragraph, or ``[]``."""
        norm = _norm(subject)
        if subject.strip() in self.gold:
            return [self.gold[subject.strip()]]
        if self.exact.get(norm):
            return [self.gold[self.exact[norm]]]
        if subject.strip() in self.context:
            return [self.context[subject.strip()]]
        position = self.subjects.index(norm) if norm in self.subjects else -1
        claimed = {t for t in self.exact.values() if t}
        if len(self.subjects) == len(self.titles) and position >= 0 and self.titles[position] not in claimed:
            return [self.gold[self.titles[position]]]
        scored = [(_match_score(subject, t), t) for t in self.titles if t not in claimed]
        best = max(scored, default=(0, ""))
        return [self.gold[best[1]]] if best[0] > 0 else []


def decomposition_from_evidences(
    evidences: Sequence[object],
    qtype: str,
    paragraphs: Sequence[Paragraph] = (),
    supporting_ids: Sequence[str] = (),
    question: str = "",
) -> list[SubStep] | None:
    """The gold decomposition of a 2Wiki record from its evidence triples (rules in the module docstring).

    Args:
        evidences: ``[[subject, relation, object], ...]`` as the record has them.
        qtype: the record's type (``comparison``, ``compositional``, ``inference``, ``bridge_comparison``).
        paragraphs: the record's context paragraphs.
        supporting_ids: the record's gold paragraph ids, in supporting-fact order.
        question: the record's question; a compared or first entity is named by its paragraph's title when the
            question uses that title (``"Charles Mathew"``, not the evidence's ``"Charles James Mathew"``).

    Returns:
        The steps, or None when ``evidences`` is empty or not a list of three non-empty strings each.

    Example:
        >>> steps = decomposition_from_evidences(
        ...     [["Charles Mathew", "father", "James Mathew"], ["James Mathew", "place of burial", "Cork"]],
        ...     "compositional")
        >>> [(s.question, s.answer) for s in steps]  # doctest: +NORMALIZE_WHITESPACE
        [('Who is the father of Charles Mathew?', 'James Mathew'), ('What is the place of burial of #1?', 'Cork')]
    """
    groups = _groups(evidences) if isinstance(evidences, list | tuple) and evidences else None
    if groups is None:
        return None
    _link(groups, qtype)
    order = sorted(range(len(groups)), key=lambda i: _level(groups, i))  # stable: level by level, evidence order
    position = {g: k for k, g in enumerate(order, start=1)}
    titles = _TitleIds(paragraphs, supporting_ids, [g.subject for g in groups])
    asked = f" {_norm(question)} "
    steps = []
    for i in order:
        g = groups[i]
        ids = titles.ids(g.subject)
        if g.parent is not None:
            subject = f"#{position[g.parent]}"
        elif ids and f" {_norm(titles.title_of[ids[0]])} " in asked:
            subject = titles.title_of[ids[0]]
        else:
            subject = _clean_name(g.subject)
        steps.append(SubStep(relation_question(g.relation, subject), g.answer, ids))
    return steps


def _parse_example(record: dict[str, Any], where: Where) -> Example:
    qid = field(record, "_id" if "_id" in record else "id", (str, int), where)
    qtype = field(record, "type", str, where, default="unknown")
    paragraphs = parse_context(record, where)
    facts = parse_supporting_facts(record, where)
    supporting_ids, sentence_ids = supporting_ids_from_facts(paragraphs, facts, where)
    answers = [gold_answer(record, "answer", where)]
    for key in _ALIAS_KEYS:
        for alias in string_list(record.get(key) or [], key, where):
            if alias not in answers:
                answers.append(alias)
    evidences = field(record, "evidences", list, where, default=[])
    decomposition = decomposition_from_evidences(
        evidences, qtype, paragraphs, supporting_ids, question=field(record, "question", str, where)
    )
    if decomposition is None:
        logger.debug("%s: evidences missing or malformed (%s); no gold decomposition", where, str(evidences)[:80])
    distinct_titles = len({title for title, _ in facts})
    return Example(
        id=str(qid),
        question=field(record, "question", str, where),
        answers=answers,
        supporting_ids=supporting_ids,
        decomposition=decomposition,
        hops=distinct_titles or HOPS_BY_TYPE.get(qtype, 2),
        type=qtype,
        dataset="2wikimultihopqa",
        metadata={
            "evidences": evidences,
            "supporting_facts": [[t, i] for t, i in facts],
            "supporting_sentence_ids": sentence_ids,
        },
    )


def load_twowiki(path: str | Path, *, limit: int | None = None) -> list[Example]:
    """Load 2WikiMultihopQA examples from the official JSON list (or JSONL of the same records).

    ``answers`` is ``[answer]`` followed by ``answer_aliases``/``aliases`` when a record has them; ``decomposition`` is
    built from the evidences (:func:`decomposition_from_evidences`; None when they are missing or malformed);
    ``metadata`` holds ``evidences`` (``[[subject, relation, object], ...]``), ``supporting_facts`` and
    ``supporting_sentence_ids``.

    Args:
        path: the dataset file.
        limit: keep only the first ``limit`` examples.

    Returns:
        The examples, in file order.

    Raises:
        DataFormatError: a record is malformed; the message names the file and the line or ``record N``.
    """
    return load_examples(path, _parse_example, limit=limit, name="2WikiMultihopQA")


def iter_paragraphs(path: str | Path) -> Iterator[Paragraph]:
    """Every context paragraph of every record, in file order, duplicates included (the corpus builder dedups)."""
    for where, record in iter_records(path):
        yield from parse_context(record, where)
