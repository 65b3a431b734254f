"""Continuous batching on a tiny random Llama: requests that join a running decode get exactly what they would get
alone; the prompt-prefix cache is reused, sliced, bounded and invalidated when an adapter's weights change."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rolecall.lm.backend import ModelBackend
from rolecall.lm.continuous import ContinuousBatcher, PrefixCache
from rolecall.lm.generation import GenerationRequest, generate_batch
from rolecall.lm.local import prompt_group

SYSTEM = "You answer questions about a fictional world of towns, rivers and record labels. " * 6


def _prompt(tok, question: str, system: str | None = SYSTEM) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


QUESTIONS = ["Where is Tavrimo?", "Who founded Orlen Vask Records and when?", "Hi", "Which river runs past Kelm?"]


def _alone(model, tok, req: GenerationRequest) -> list[list[int]]:
    """What ``req`` decodes to in a batch of its own (the static path, no prefix sharing)."""
    return [c.token_ids for c in generate_batch(model, tok, [req], min_shared_prefix=10**9)[0]]


@pytest.fixture
def backend(tiny_model, smollm_tokenizer):
    b = ModelBackend(tiny_model, tokenizer=smollm_tokenizer, batching="continuous")
    yield b
    b.batcher.close()


def test_default_backend_batches_continuously(backend):
    assert isinstance(backend.batcher, ContinuousBatcher)


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "copy"])
def test_staggered_requests_match_their_solo_decodes(backend, tiny_model, smollm_tokenizer, in_place):
    """Requests arriving while others decode (mixed budgets, n samples, seeded sampling) get their solo outputs, whether
    newcomers are written into the running batch's free rows or the batch is copied at every admission."""
    tok = smollm_tokenizer
    backend.batcher.in_place_merge = in_place
    reqs = [
        GenerationRequest(_prompt(tok, QUESTIONS[0]), max_tokens=20),
        GenerationRequest(_prompt(tok, QUESTIONS[1]), max_tokens=5),
        GenerationRequest(_prompt(tok, QUESTIONS[2], system=None), max_tokens=12, n=3, temperature=1.0, seed=4),
        GenerationRequest(_prompt(tok, QUESTIONS[3]), max_tokens=9, n=2, temperature=0.7, top_p=0.9, seed=1),
    ]
    expected = [_alone(tiny_model, tok, r) for r in reqs]
    results: dict[int, list[list[int]]] = {}

    def submit(i: int, delay: float) -> None:
        time.sleep(delay)
        results[i] = [c.token_ids for c in backend.batcher.generate(reqs[i])]

    threads = [threading.Thread(target=submit, args=(i, 0.05 * i)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [results[i] for i in range(len(reqs))] == expected
    stats = backend.batcher.stats
    assert stats.requests == len(reqs)
    assert stats.rows == 1 + 1 + 3 + 2
    if not in_place:
        assert stats.in_place_merges == 0


def test_a_request_joins_a_running_decode(backend, smollm_tokenizer):
    """A short request submitted while a long one decodes finishes first: it did not wait for the long one."""
    tok = smollm_tokenizer
    long_req = GenerationRequest(_prompt(tok, QUESTIONS[0]), max_tokens=150, stop=("\x00never",))
    short_req = GenerationRequest(_prompt(tok, QUESTIONS[1]), max_tokens=3)
    long_fut = backend.batcher.submit(long_req)
    while backend.batcher.stats.steps < 5:  # the long request is decoding
        time.sleep(0.01)
    short_fut = backend.batcher.submit(short_req)
    short_fut.result(timeout=120)
    assert not long_fut.done(), "the short request should finish while the long one is still decoding"
    assert len(long_fut.result(timeout=300)[0].token_ids) <= 150
    assert backend.batcher.stats.admissions == 2
    assert backend.batcher.stats.max_rows == 2


def test_newcomers_are_written_in_place_into_free_slots(tiny_model, smollm_tokenizer):
    """Short requests that arrive while a long-prompt request decodes are written into the running batch's own buffers
    (finished rows' slots, then spare rows) instead of copying the whole batch, and still get their solo outputs."""
    tok = smollm_tokenizer
    backend = ModelBackend(tiny_model, tokenizer=smollm_tokenizer, batching="continuous", max_batch_rows=4)
    long_prompt = _prompt(tok, "Tell me everything about Tavrimo. " * 12)
    long_req = GenerationRequest(long_prompt, max_tokens=60, stop=("\x00never",))
    short = [
        GenerationRequest(
            _prompt(tok, QUESTIONS[i % 4], system=None),
            max_tokens=3 + i % 5,
            n=1 + (i == 3),
            temperature=0.8 if i == 3 else 0.0,
            seed=i,
        )
        for i in range(9)
    ]
    expected = [_alone(tiny_model, tok, r) for r in [long_req, *short]]
    try:
        long_fut = backend.batcher.submit(long_req)
        while backend.batcher.stats.steps < 3:
            time.sleep(0.005)
        outs = []
        for req in short:  # one after another: each joins the running decode, mostly into a finished row's slot
            outs.append([c.token_ids for c in backend.batcher.generate(req)])
        outs.insert(0, [c.token_ids for c in long_fut.result(timeout=300)])
        stats = backend.batcher.stats
    finally:
        backend.batcher.close()
    assert outs == expected
    assert stats.in_place_merges >= 5, stats
    assert stats.copied_merges <= 2, stats
    assert stats.max_rows <= 4


def test_prefix_cache_is_reused_across_batches(backend, tiny_model, smollm_tokenizer):
    """Sequential requests of one role share its header: later ones reuse the cached prefix, outputs unchanged."""
    tok = smollm_tokenizer
    reqs = [GenerationRequest(_prompt(tok, q), max_tokens=6) for q in QUESTIONS]
    outs = [[c.token_ids for c in backend.batcher.generate(r)] for r in reqs]  # one at a time: no batch shares
    assert outs == [_alone(tiny_model, tok, r) for r in reqs]
    cache = backend.batcher.prefix_cache
    assert cache.hits >= len(reqs) - 1
    header = len(_prompt(tok, "")) - 10  # roughly the system message's tokens
    assert cache.reused_tokens >= (len(reqs) - 1) * header * 0.8


def test_prefix_cache_keeps_each_roles_header(backend, tiny_model, smollm_tokenizer):
    """Two roles whose system messages share only their opening words: alternating their requests must not cut one
    role's cached header down to the words it shares with the other (they are told apart by ``prompt_group``)."""
    tok = smollm_tokenizer
    # the two system messages share SYSTEM, then go on differently for as long again
    systems = [SYSTEM + "Answer in one short phrase. " * 12, SYSTEM + "Explain your answer step by step. " * 10]
    reqs = []
    for q in QUESTIONS:
        for system in systems:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
            reqs.append(GenerationRequest(_prompt(tok, q, system), max_tokens=4, prefix_group=prompt_group(messages)))
    assert reqs[0].prefix_group != reqs[1].prefix_group
    outs = [[c.token_ids for c in backend.batcher.generate(r)] for r in reqs]  # one at a time
    assert outs == [_alone(tiny_model, tok, r) for r in reqs]
    cache = backend.batcher.prefix_cache
    header = min(len(_prompt(tok, "", system)) for system in systems) - 10
    assert cache.hits >= len(reqs) - 2  # each role misses once, on its first prompt
    assert cache.reused_tokens >= (len(reqs) - 2) * header * 0.8


def _perturb(backend: ModelBackend, adapter: str) -> None:
    """Change ``adapter``'s weights the way a trainer step does, and say so."""
    with torch.no_grad():
        for name, p in backend.model.named_parameters():
            if f"lora_B.{adapter}" in name:
                p.normal_(0, 0.3)
    backend.mark_updated(adapter)


def test_prefix_cache_dropped_when_adapter_changes(tiny_model, smollm_tokenizer):
    """After a trainer changes an adapter (mark_updated), its old cached prefixes are not reused."""
    from peft import LoraConfig

    backend = ModelBackend(
        tiny_model, tokenizer=smollm_tokenizer, lora_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    try:
        backend.ensure_adapter("plan")
        _perturb(backend, "plan")
        first = GenerationRequest(_prompt(smollm_tokenizer, QUESTIONS[0]), max_tokens=6, adapter="plan")
        backend.batcher.generate(first)
        _perturb(backend, "plan")
        second = GenerationRequest(_prompt(smollm_tokenizer, QUESTIONS[1]), max_tokens=6, adapter="plan")
        got = [c.token_ids for c in backend.batcher.generate(second)]
        backend.model.eval()
        assert got == _alone(backend.model, smollm_tokenizer, second)
        assert backend.batcher.prefix_cache.hits == 0
        # the adapter's weights are trainable, yet nothing generation keeps may hold an autograd graph (memory leak)
        assert any(p.requires_grad for p in backend.model.parameters())
        kept = [t for e in backend.batcher.prefix_cache._entries.values() for kv in e.layers for t in kv]
        assert kept and all(t.grad_fn is None and not t.requires_grad for t in kept)
    finally:
        backend.batcher.close()


def test_row_cap_and_oversized_request(tiny_model, smollm_tokenizer):
    backend = ModelBackend(tiny_model, tokenizer=smollm_tokenizer, max_batch_rows=2)
    try:
        tok = smollm_tokenizer
        futs = [backend.batcher.submit(GenerationRequest(_prompt(tok, q), max_tokens=4)) for q in QUESTIONS]
        big = backend.batcher.submit(GenerationRequest(_prompt(tok, "Hi"), n=3, temperature=1.0, max_tokens=4, seed=0))
        assert all(len(f.result(timeout=120)) == 1 for f in futs)
        assert len(big.result(timeout=120)) == 3
        assert backend.batcher.stats.max_rows == 3  # the oversized request ran alone
    finally:
        backend.batcher.close()


def test_failed_request_reaches_its_caller_and_the_loop_keeps_serving(backend, smollm_tokenizer):
    """A request the model cannot run (a token id outside the vocabulary) fails alone, even when it was admitted
    together with good ones, and the loop keeps serving."""
    tok = smollm_tokenizer
    ok = backend.batcher.submit(GenerationRequest(_prompt(tok, QUESTIONS[0]), max_tokens=4))
    bad = backend.batcher.submit(GenerationRequest(_prompt(tok, QUESTIONS[1])[:-1] + [10**7], max_tokens=4))
    ok2 = backend.batcher.submit(GenerationRequest(_prompt(tok, QUESTIONS[2]), max_tokens=4))
    with pytest.raises(IndexError):
        bad.result(timeout=120)
    assert len(ok.result(timeout=120)) == 1 and len(ok2.result(timeout=120)) == 1
    assert len(backend.batcher.generate(GenerationRequest(_prompt(tok, "Hi"), max_tokens=3))) == 1


def test_close_finishes_queued_work(tiny_model, smollm_tokenizer):
    backend = ModelBackend(tiny_model, tokenizer=smollm_tokenizer)
    futs = [backend.batcher.submit(GenerationRequest(_prompt(smollm_tokenizer, q), max_tokens=4)) for q in QUESTIONS]
    backend.batcher.close()
    assert all(f.done() and len(f.result()) == 1 for f in futs)
    with pytest.raises(RuntimeError):
        backend.batcher.submit(GenerationRequest([1, 2, 3]))


def test_prefix_cache_slices_bounds_and_drops_stale():
    def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.arange(n, dtype=torch.float32).view(1, 1, n, 1), torch.zeros(1, 1, n, 1)) for _ in range(2)]

    per_token = 2 * 2 * 4  # two layers, keys and values, one float each
    cache = PrefixCache(max_bytes=per_token * 100, min_shared=4)
    key = ("plan", 0)
    cache.store(key, list(range(50)), kv(50))
    assert cache.lookup(key, list(range(3)) + [99]) is None  # shares 3 < min_shared tokens
    hit = cache.lookup(key, list(range(10)) + [77, 78])
    assert hit is not None and hit[0][0].shape[2] == 10
    assert hit[0][0].flatten().tolist() == list(range(10))  # the first 10 positions of the stored prefix
    assert cache.nbytes == per_token * 10  # the entry was cut to the shared part
    assert cache.lookup(("plan", 1), list(range(20))) is None  # another adapter version never matches
    assert cache.lookup(key, list(range(10))) is not None and cache.lookup(key, list(range(10)))[0][0].shape[2] == 9
    cache.store(key, list(range(100, 160)), kv(60))
    cache.store(key, list(range(200, 260)), kv(60))  # over the budget: the least recently used entries go
    assert cache.nbytes <= cache.max_bytes
    assert len(cache) == 1
    cache.drop_stale("plan", 1)
    assert len(cache) == 0 and cache.nbytes == 0


def test_call_runs_between_decode_steps_of_a_running_batch(backend, smollm_tokenizer):
    """A trainer's update queued while a request decodes runs on the batcher's thread, and the request finishes."""
    tok = smollm_tokenizer
    fut = backend.batcher.submit(GenerationRequest(_prompt(tok, QUESTIONS[0]), max_tokens=60, stop=("\x00never",)))
    while backend.batcher.stats.steps < 3:
        time.sleep(0.01)
    seen = backend.run_on_model_thread(lambda: (threading.current_thread().name, fut.done()))
    assert seen == ("rolecall-continuous-batcher", False)
    assert len(fut.result(timeout=120)[0].token_ids) == 60
