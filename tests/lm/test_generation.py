"""The batched decoding loop on a tiny random Llama: batching, n samples, stop strings, budgets, log-probs."""

from __future__ import annotations

import torch

from rolecall.lm.generation import GenerationRequest, assemble_cache, generate_batch, pad_left


def _prompt(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)


PROMPTS = ["Hello there", "What is the capital of the country that borders Spain to the north?", "Hi"]


def test_batched_greedy_equals_unbatched(tiny_model, smollm_tokenizer):
    reqs = [GenerationRequest(_prompt(smollm_tokenizer, p), max_tokens=12) for p in PROMPTS]
    batched = generate_batch(tiny_model, smollm_tokenizer, reqs)
    for req, out in zip(reqs, batched, strict=True):
        alone = generate_batch(tiny_model, smollm_tokenizer, [req])[0]
        assert out[0].token_ids == alone[0].token_ids


def test_matches_hf_generate_greedy(tiny_model, smollm_tokenizer):
    ids = _prompt(smollm_tokenizer, PROMPTS[1])
    ours = generate_batch(tiny_model, smollm_tokenizer, [GenerationRequest(ids, max_tokens=10)])[0][0]
    ref = tiny_model.generate(
        torch.tensor([ids]), max_new_tokens=10, do_sample=False, eos_token_id=smollm_tokenizer.eos_token_id
    )
    assert ours.token_ids == ref[0, len(ids) :].tolist()[: len(ours.token_ids)]


def test_n_samples_and_seed(tiny_model, smollm_tokenizer):
    req = GenerationRequest(_prompt(smollm_tokenizer, "Hi"), n=4, temperature=1.0, max_tokens=8, seed=7)
    first = generate_batch(tiny_model, smollm_tokenizer, [req])[0]
    again = generate_batch(tiny_model, smollm_tokenizer, [req])[0]
    assert len(first) == 4
    assert [c.token_ids for c in first] == [c.token_ids for c in again]  # seeded: reproducible
    assert len({tuple(c.token_ids) for c in first}) > 1  # random 49k-vocab model: samples differ
    # the same seeded request gives the same samples when batched with other work
    mixed = generate_batch(
        tiny_model, smollm_tokenizer, [GenerationRequest(_prompt(smollm_tokenizer, "Other"), max_tokens=5), req]
    )[1]
    assert [c.token_ids for c in mixed] == [c.token_ids for c in first]


def test_max_tokens_and_length_finish(tiny_model, smollm_tokenizer):
    out = generate_batch(
        tiny_model, smollm_tokenizer, [GenerationRequest(_prompt(smollm_tokenizer, "Hi"), max_tokens=3)]
    )[0][0]
    assert len(out.token_ids) <= 3
    if len(out.token_ids) == 3 and out.token_ids[-1] != smollm_tokenizer.eos_token_id:
        assert out.finish_reason == "length"


def test_stop_string_cuts_text(tiny_model, smollm_tokenizer):
    ids = _prompt(smollm_tokenizer, PROMPTS[1])
    free = generate_batch(tiny_model, smollm_tokenizer, [GenerationRequest(ids, max_tokens=12)])[0][0]
    if len(free.text) < 6:
        return  # degenerate random output: nothing to cut
    stop = free.text[3:6]
    cut = generate_batch(tiny_model, smollm_tokenizer, [GenerationRequest(ids, max_tokens=12, stop=(stop,))])[0][0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.find(stop)]
    assert len(cut.token_ids) <= len(free.token_ids)


def test_logprobs_match_forward_pass(tiny_model, smollm_tokenizer):
    ids = _prompt(smollm_tokenizer, PROMPTS[0])
    reqs = [GenerationRequest(ids, n=2, temperature=1.0, max_tokens=6, seed=1, logprobs=True)]
    outs = generate_batch(tiny_model, smollm_tokenizer, reqs)[0]
    for c in outs:
        full = torch.tensor([ids + c.token_ids])
        with torch.no_grad():
            logits = tiny_model(full).logits[0, len(ids) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_logprobs_are_under_the_distribution_each_row_was_sampled_from(tiny_model, smollm_tokenizer):
    """log_softmax(logits / T) of the sampled token, per row of one mixed batch (greedy rows: the raw logits), as
    vLLM's processed log-probs: what the trainer's forward at the sampling temperature compares (issue 53)."""
    ids = _prompt(smollm_tokenizer, PROMPTS[0])
    temperatures = (0.7, 0.0, 1.3)
    reqs = [GenerationRequest(ids, n=2 if t else 1, temperature=t, max_tokens=6, seed=3, logprobs=True)
            for t in temperatures]  # fmt: skip
    for t, outs in zip(temperatures, generate_batch(tiny_model, smollm_tokenizer, reqs), strict=True):
        for c in outs:
            with torch.no_grad():
                logits = tiny_model(torch.tensor([ids + c.token_ids])).logits[0, len(ids) - 1 : -1].float()
            expected = torch.log_softmax(logits / (t or 1.0), -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
            if t:  # not the temperature-1 values the sampler used to report
                raw = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
                assert (torch.tensor(c.logprobs) - raw).abs().max() > 1e-3


def test_top_p_tiny_keeps_only_argmax(tiny_model, smollm_tokenizer):
    ids = _prompt(smollm_tokenizer, PROMPTS[2])
    greedy = generate_batch(tiny_model, smollm_tokenizer, [GenerationRequest(ids, max_tokens=6)])[0][0]
    nucleus = generate_batch(
        tiny_model, smollm_tokenizer, [GenerationRequest(ids, temperature=1.0, top_p=1e-6, max_tokens=6, seed=3)]
    )[0][0]
    assert nucleus.token_ids == greedy.token_ids


def test_shared_prefix_prefill_matches_full_prefill(tiny_model, smollm_tokenizer):
    """Prompts that share a long prefix (a signature's instructions and demos) encode it once; outputs are unchanged."""
    system = "You answer questions about a fictional world. " * 12
    reqs = [
        GenerationRequest(
            list(
                smollm_tokenizer.apply_chat_template(
                    [{"role": "system", "content": system}, {"role": "user", "content": q}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
            ),
            max_tokens=8,
            n=n,
        )
        for q, n in [("Where is Tavrimo?", 1), ("Who founded Orlen Vask Records and when?", 2), ("Hi", 1)]
    ]
    shared = generate_batch(tiny_model, smollm_tokenizer, reqs, min_shared_prefix=8)
    unshared = generate_batch(tiny_model, smollm_tokenizer, reqs, min_shared_prefix=10**9)
    assert [[c.token_ids for c in r] for r in shared] == [[c.token_ids for c in r] for r in unshared]
    assert all(r[0].prompt_tokens == len(q.prompt_ids) for r, q in zip(shared, reqs, strict=True))


def test_grouped_prefixes_with_mixed_adapters(tiny_model, smollm_tokenizer):
    """Two adapters, each with its own shared prefix (different role prompts), plus a lone request: same outputs as a
    plain full prefill."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]), adapter_name="a")
    model.add_adapter("b", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    model.eval()

    def prompt(system: str, q: str) -> list[int]:
        ids = smollm_tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return list(ids)

    plan_sys, analysis_sys = "Plan the sub-questions. " * 10, "Read the passages and answer. " * 14
    reqs = [
        GenerationRequest(prompt(plan_sys, "Where is Tavrimo?"), max_tokens=6, adapter="a"),
        GenerationRequest(prompt(analysis_sys, "Who founded Orlen Vask Records?"), max_tokens=6, adapter="b"),
        GenerationRequest(prompt(plan_sys, "Who directed Zopor Orchard?"), max_tokens=6, adapter="a"),
        GenerationRequest(prompt(analysis_sys, "When?"), max_tokens=6, adapter="b", n=2),
        GenerationRequest(prompt("Something else entirely.", "Hi"), max_tokens=6),
    ]
    grouped = generate_batch(model, smollm_tokenizer, reqs, min_shared_prefix=8)
    plain = generate_batch(model, smollm_tokenizer, reqs, min_shared_prefix=10**9)
    assert [[c.token_ids for c in r] for r in grouped] == [[c.token_ids for c in r] for r in plain]


def test_growable_cache_appends_in_place_and_survives_reorder():
    """Decode steps write into preallocated slack (no copy of the whole cache per token); a reorder that replaces the
    tensors (rows leaving the batch) is picked up by the next update."""
    from rolecall.lm.generation import new_cache

    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 3, 5, 4, generator=g), torch.randn(2, 3, 5, 4, generator=g)
    cache = new_cache()
    cache.update(k, v, 0)
    buffer = cache.layers[0]._buf_k
    k2, v2 = torch.randn(2, 3, 1, 4, generator=g), torch.randn(2, 3, 1, 4, generator=g)
    keys, values = cache.update(k2, v2, 0)
    assert cache.layers[0]._buf_k is buffer  # appended in place
    assert torch.equal(keys, torch.cat([k, k2], 2)) and torch.equal(values, torch.cat([v, v2], 2))
    assert cache.get_seq_length() == 6
    cache.reorder_cache(torch.tensor([1]))
    k3, v3 = torch.randn(1, 3, 1, 4, generator=g), torch.randn(1, 3, 1, 4, generator=g)
    keys, values = cache.update(k3, v3, 0)
    assert torch.equal(keys, torch.cat([k[1:], k2[1:], k3], 2))
    assert torch.equal(values, torch.cat([v[1:], v2[1:], v3], 2))


def test_assemble_cache_selects_trims_pads_and_grows_in_place():
    """Rows picked from two caches, leading columns dropped, right-aligned with zero padding: the same tensors as
    index_select + slice + pad + cat, and the result appends a decode step without reallocating."""
    gen = torch.Generator().manual_seed(0)
    a = [(torch.randn(4, 2, 7, 3, generator=gen), torch.randn(4, 2, 7, 3, generator=gen)) for _ in range(2)]
    b = [(torch.randn(2, 2, 3, 3, generator=gen), torch.randn(2, 2, 3, 3, generator=gen)) for _ in range(2)]
    cache = assemble_cache([(a, [0, 2, 3], 2), (b, None, 0)], extra=1)
    keep = torch.tensor([0, 2, 3])
    for layer, ((ka, va), (kb, vb)) in enumerate(zip(a, b, strict=True)):
        want_k = torch.cat([ka.index_select(0, keep)[:, :, 2:], pad_left(kb, 5, 2)])
        want_v = torch.cat([va.index_select(0, keep)[:, :, 2:], pad_left(vb, 5, 2)])
        assert torch.equal(cache.layers[layer].keys, want_k)
        assert torch.equal(cache.layers[layer].values, want_v)
    buffer = cache.layers[0]._buf_k
    step = torch.ones(5, 2, 1, 3)
    keys, _ = cache.update(step, step, 0)
    assert keys.shape == (5, 2, 6, 3) and torch.equal(keys[:, :, -1:], step)
    assert cache.layers[0]._buf_k is buffer  # appended into the preallocated room
