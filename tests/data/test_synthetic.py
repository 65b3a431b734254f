"""Tests of the synthetic world: determinism, splits, gold decompositions, uniqueness, export, parametric memory."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rolecall.data.synthetic import QUESTION_TYPES, WorldConfig, resolve, synthetic_world
from rolecall.data.synthetic.memory_check import OPEN_TYPES, answer_matches, parametric_accuracy
from rolecall.data.types import Example
from rolecall.errors import ConfigError

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SMALL = {"n_people": 120, "n_films": 24, "n_books": 16, "n_bands": 10, "n_train": 60, "n_dev": 20, "n_test": 30}


@pytest.fixture(scope="module")
def world():
    start = time.perf_counter()
    built = synthetic_world(seed=0)
    elapsed = time.perf_counter() - start
    logger.info("default synthetic world built in %.2fs", elapsed)
    # The issue asks for < 10 s; 30 s is a sanity bound that a slow CI machine still meets.
    assert elapsed < 30, f"building the default world took {elapsed:.1f}s"
    return built


def _all(world):
    return [e for split in world.splits.values() for e in split]


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for name in ("train", "dev", "test", "corpus"):
        h.update((directory / f"{name}.jsonl").read_bytes())
    return h.hexdigest()


def test_default_sizes(world):
    assert len(world.train) >= 300 and len(world.dev) >= 100 and len(world.test) >= 200
    assert world.seed == 0 and len(world.entities) > 500 and len(world.corpus) > len(world.entities)


def test_same_seed_is_byte_identical_across_processes(tmp_path):
    synthetic_world(seed=3, **SMALL).to_flashrag(tmp_path / "a")
    synthetic_world(seed=3, **SMALL).to_flashrag(tmp_path / "b")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    # A fresh interpreter with another string-hash salt must produce the same bytes.
    code = (
        "import sys; from rolecall.data.synthetic import synthetic_world; "
        f"synthetic_world(seed=3, **{SMALL!r}).to_flashrag(sys.argv[1])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], check=True, cwd=REPO, env=env)
    assert _digest(tmp_path / "c") == _digest(tmp_path / "a")


def test_different_seeds_differ():
    a, b = synthetic_world(seed=1, **SMALL), synthetic_world(seed=2, **SMALL)
    assert [d.text for d in a.corpus] != [d.text for d in b.corpus]
    assert {e.question for e in a.test}.isdisjoint({e.question for e in b.test})


def test_splits_are_disjoint(world):
    texts = {name: {e.question for e in split} for name, split in world.splits.items()}
    assert all(len(texts[n]) == len(split) for n, split in world.splits.items()), "duplicate question in a split"
    assert texts["train"].isdisjoint(texts["dev"]) and texts["train"].isdisjoint(texts["test"])
    assert texts["dev"].isdisjoint(texts["test"])
    facts = {name: {f for e in split for f in e.metadata["facts"]} for name, split in world.splits.items()}
    assert facts["train"].isdisjoint(facts["test"]) and facts["dev"].isdisjoint(facts["test"])
    assert facts["train"].isdisjoint(facts["dev"])
    ids = [e.id for e in _all(world)]
    assert len(ids) == len(set(ids))


def test_every_type_in_every_split(world):
    for name, split in world.splits.items():
        types = collections.Counter(e.type for e in split)
        assert set(types) == set(QUESTION_TYPES), (name, types)
        hops = {e.hops for e in split if e.type == "compositional"}
        assert hops == {2, 3, 4}, (name, hops)
        yes_no = {e.answer for e in split if e.type == "yes_no"}
        assert yes_no == {"yes", "no"}, (name, yes_no)
        assert all(e.dataset == "synthetic" for e in split)


def test_decompositions_are_grounded(world):
    docs = {d.id: d for d in world.corpus}
    assert len(docs) == len(world.corpus), "duplicate document id"
    for e in _all(world):
        assert e.decomposition, e.question
        union = list(dict.fromkeys(s for step in e.decomposition for s in step.supporting_ids))
        assert e.supporting_ids == union
        for k, step in enumerate(e.decomposition, start=1):
            assert all(int(ref) < k for ref in re.findall(r"#(\d+)", step.question)), step.question
            assert step.supporting_ids, step.question
            for doc_id in step.supporting_ids:
                assert doc_id in docs, doc_id
                assert step.answer in docs[doc_id].text, (step.answer, docs[doc_id].text)


def test_chain_answer_is_last_sub_answer(world):
    for e in _all(world):
        if e.type in ("single", "compositional", "inference"):
            assert e.answer == e.decomposition[-1].answer, e.question
            assert e.hops == len(e.decomposition)
        elif e.type == "intersection":
            assert e.answer == e.decomposition[-1].answer


def test_answers_are_unique_per_resolver(world):
    for e in _all(world):
        assert resolve(world.entities, e.metadata["program"]) == e.answer, e.question
        if e.type in ("comparison", "bridge_comparison"):
            names = [world.entities[k].name for k in e.metadata["program"]["entities"]]
            assert e.answer in names and names[0] != names[1]
    # A name identifies one entity of its kind, so a question that names the kind names one entity.
    for kind in ("person", "film", "book", "band", "company", "university", "city", "country"):
        names = [x.name for x in world.entities.of_kind(kind)]
        assert len(names) == len(set(names)), kind
    # The same question text never has two answers.
    answers = collections.defaultdict(set)
    for e in _all(world):
        answers[e.question].add(e.answer)
    assert all(len(a) == 1 for a in answers.values())


def test_homonym_and_near_miss_documents(world):
    by_title = collections.defaultdict(list)
    for doc in world.corpus:
        by_title[doc.title].append(doc.id)
    shared = {t: ids for t, ids in by_title.items() if len(ids) > 1}
    kinds = {tuple(sorted(i.split("/")[0] for i in ids)) for ids in shared.values()}
    assert ("film", "person") in kinds and ("band", "city") in kinds, kinds
    surnames = collections.Counter(p.name.split()[-1] for p in world.entities.of_kind("person"))
    assert max(surnames.values()) >= 2
    prefixes = collections.Counter(d.id.split("/")[0] for d in world.corpus)
    assert prefixes["event"] > 0 and prefixes["surname"] > 0
    plain = synthetic_world(seed=0, distractors=False, **SMALL)
    assert all(d.id.split("/")[0] not in ("event", "surname") for d in plain.corpus)


def test_entity_documents_have_three_to_six_sentences(world):
    for doc in world.corpus:
        if doc.id in world.entities:
            assert doc.title == world.entities[doc.id].name
            n = len(re.findall(r"[.?!](?:\s|$)", doc.text))
            assert 3 <= n <= 6, doc


def test_flashrag_export(world, tmp_path):
    paths = world.to_flashrag(tmp_path)
    assert sorted(p.name for p in paths.values()) == ["corpus.jsonl", "dev.jsonl", "test.jsonl", "train.jsonl"]
    for name, split in world.splits.items():
        rows = [json.loads(line) for line in paths[name].read_text(encoding="utf-8").splitlines()]
        assert [r["id"] for r in rows] == [e.id for e in split]
        row, example = rows[0], split[0]
        assert row["golden_answers"] == example.answers and row["question"] == example.question
        meta = row["metadata"]
        assert meta["supporting_ids"] == example.supporting_ids and meta["type"] == example.type
        assert meta["hops"] == example.hops and meta["decomposition"][0]["answer"] == example.decomposition[0].answer
        assert set(meta["decomposition"][0]) == {"question", "answer", "supporting_ids"}
    corpus = [json.loads(line) for line in paths["corpus"].read_text(encoding="utf-8").splitlines()]
    assert len(corpus) == len(world.corpus)
    assert corpus[0] == {"id": world.corpus[0].id, "contents": f'"{world.corpus[0].title}"\n{world.corpus[0].text}'}


def test_examples_round_trip_and_convert_to_dspy(world):
    e = world.test[0]
    assert Example.from_dict(json.loads(json.dumps(e.to_dict()))) == e
    assert e.to_dspy().question == e.question


def test_config_is_validated():
    with pytest.raises(ConfigError, match="n_cities"):
        synthetic_world(seed=0, n_countries=10, n_cities=12)
    with pytest.raises(ConfigError, match="n_people"):
        WorldConfig(n_people=5)
    with pytest.raises(ConfigError, match="n_test"):
        synthetic_world(seed=0, n_test=-1)


def test_parametric_accuracy_scoring():
    w = synthetic_world(seed=0, **SMALL)
    oracle = {e.question: e.answer for e in w.test}
    assert parametric_accuracy(w, lambda ps: [oracle[p.rsplit("Question: ", 1)[1]] for p in ps]) == 1.0
    assert parametric_accuracy(w, lambda ps: ["I cannot say"] * len(ps), types=None) == 0.0
    assert answer_matches("The answer is 1,234,000.", ["1,234,000", "1234000"])
    assert not answer_matches("Orlen", ["Orlen Vask"])
    with pytest.raises(ConfigError):
        parametric_accuracy(w, lambda ps: [], split="nope")


@pytest.mark.slow
def test_embedded_lm_cannot_answer_from_memory(world):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rolecall.lm.embedded import embedded_lm_path

    path = str(embedded_lm_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def generate(prompts: list[str], batch_size: int = 16) -> list[str]:
        out = []
        for i in range(0, len(prompts), batch_size):
            chats = [[{"role": "user", "content": p}] for p in prompts[i : i + batch_size]]
            texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
            batch = tokenizer(texts, return_tensors="pt", padding=True)
            with torch.no_grad():
                ids = model.generate(**batch, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            out += tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        return out

    start = time.perf_counter()
    accuracy = parametric_accuracy(world, generate, split="test", limit=100, types=OPEN_TYPES)
    logger.info("SmolLM2-135M closed-book accuracy on 100 open test questions: %.3f (%.1fs)", accuracy,
                time.perf_counter() - start)  # fmt: skip
    assert accuracy < 0.05
