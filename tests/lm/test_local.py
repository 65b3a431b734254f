"""LocalLM as a DSPy LM on a tiny random Llama: engine path, n samples, cache bypass, log-probs, role adapters."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
import torch

from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.lm.generation import GenerationRequest

MSG = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)


def test_is_a_dspy_lm_on_the_engine_api(lm):
    assert isinstance(lm, dspy.LM)
    assert lm.model.startswith("local/")
    out = lm(messages=MSG)
    assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], str)
    assert lm.history[-1]["usage"]["completion_tokens"] >= 1  # usage counted


def test_n_samples_via_dspy(lm):
    outs = lm(messages=MSG, n=4, temperature=1.0)
    assert len(outs) == 4
    assert lm.backend.batcher.stats.max_rows >= 2  # the four one-sample calls ran as one batch


def test_sampled_calls_bypass_cache(tiny_model, smollm_tokenizer):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=6, cache=True)
    before = lm.backend.batcher.stats.requests
    lm(messages=MSG, temperature=1.0)
    lm(messages=MSG, temperature=1.0)
    assert lm.backend.batcher.stats.requests - before == 2  # both reached the model


def test_logprobs_through_dspy(lm):
    out = lm(messages=MSG, logprobs=True)
    content = out[0]["logprobs"]["content"]
    assert len(content) >= 1 and all(tok["logprob"] <= 0 for tok in content)


def test_sample_api_shares_prefill(lm):
    comps = lm.sample(MSG, n=3, temperature=1.0, seed=0, logprobs=True)
    assert len(comps) == 3 and all(c.logprobs is not None for c in comps)
    many = lm.sample([MSG, MSG], n=2)
    assert [len(x) for x in many] == [2, 2]


def test_predict_reaches_adapter_parse(lm):
    """A random model cannot follow the format: the failure must be the adapter's parse error, nothing else."""
    for adapter in (dspy.ChatAdapter(), dspy.JSONAdapter(), dspy.XMLAdapter()):
        with dspy.context(lm=lm, adapter=adapter):
            try:
                dspy.Predict("question -> answer")(question="2+2?")
            except Exception as exc:  # noqa: BLE001 - the type is what we check
                assert "Adapter" in type(exc).__name__ or "parse" in str(exc).lower(), exc


def test_for_role_creates_adapter_views(lm):
    plan = lm.for_role("plan")
    rewrite = lm.for_role("rewrite")
    assert set(lm.backend.adapters) == {"plan", "rewrite"}
    assert plan.adapter == "plan" and plan.model.endswith("@plan") and not plan.cache
    assert plan.backend is lm.backend  # one base model
    # a fresh LoRA adapter is the identity (B = 0): same greedy output as the base model
    assert plan(messages=MSG) == lm(messages=MSG)
    assert rewrite.base.adapter is None


def test_mixed_adapter_batch_matches_separate_runs(lm):
    a, b = lm.for_role("a"), lm.for_role("b")
    with torch.no_grad():
        for name, p in lm.hf_model.named_parameters():
            if "lora_B.b" in name:
                p.normal_(0, 0.5)  # make adapter b differ from the base
    req = lambda ad: GenerationRequest(lm.backend.encode_messages(MSG), max_tokens=8, adapter=ad)  # noqa: E731
    alone = [lm.backend._run_batch([req(ad)])[0][0].token_ids for ad in (None, "a", "b")]
    mixed = [c[0].token_ids for c in lm.backend._run_batch([req(None), req("a"), req("b")])]
    assert mixed == alone
    assert alone[2] != alone[0]  # adapter b really changes the output
    # and concurrent DSPy calls of different roles share batches
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda v: v(messages=MSG), [lm, a, b]))


def test_adapter_save_load_peft_format(lm, tmp_path):
    view = lm.for_role("analysis")
    with torch.no_grad():
        for name, p in lm.hf_model.named_parameters():
            if "lora_B.analysis" in name:
                p.fill_(0.01)
    expected = view(messages=MSG)
    view.save_adapter(tmp_path / "analysis")
    files = {p.name for p in (tmp_path / "analysis").iterdir()}
    assert "adapter_config.json" in files and "adapter_model.safetensors" in files
    assert json.loads((tmp_path / "analysis" / "adapter_config.json").read_text())["r"] == 8
    with torch.no_grad():
        for name, p in lm.hf_model.named_parameters():
            if "lora_B.analysis" in name:
                p.zero_()
    reloaded = lm.load_adapter(tmp_path / "analysis", name="analysis")
    assert reloaded(messages=MSG) == expected


def test_errors(lm, tmp_path):
    with pytest.raises(ValueError):
        lm.for_role("")
    with pytest.raises(ValueError):
        lm.save_adapter(tmp_path)
    from rolecall.errors import ConfigError, ModelLoadError

    with pytest.raises(ModelLoadError):
        lm.load_adapter(tmp_path / "missing", name="x")
    with pytest.raises(ConfigError):
        LocalLM(object())  # a model object without its tokenizer


def test_untrained_adapters_run_as_the_base_model(lm):
    view = lm.for_role("fresh")
    backend = lm.backend
    assert backend.is_identity_adapter("fresh")
    req = GenerationRequest(backend.encode_messages(MSG), max_tokens=6, adapter="fresh")
    assert backend.route_identity_adapters([req])[0].adapter is None
    with torch.no_grad():
        for name, p in lm.hf_model.named_parameters():
            if "lora_B.fresh" in name:
                p.normal_(0, 0.5)
    assert backend.is_identity_adapter("fresh"), "cached until the trainer says the weights changed"
    backend.mark_updated("fresh")
    assert not backend.is_identity_adapter("fresh")
    assert backend.route_identity_adapters([req])[0].adapter == "fresh"
    assert isinstance(view(messages=MSG)[0], str)


def test_base_rows_skip_lora_and_leave_trainable_adapters_alone(lm, tiny_model, smollm_tokenizer):
    """A batch wholly on the base model switches the LoRA layers off for the pass only: the output is the plain model's
    even while a trained adapter is the active one, and afterwards the adapter computes and trains as before."""
    prompt = lm.backend.encode_messages(MSG)
    base_req = GenerationRequest(prompt, max_tokens=6)
    before = lm.backend.generate([base_req])[0][0].token_ids  # plain model (no adapter yet)
    lm.for_role("trained")
    peft_model = lm.backend.model
    peft_model.set_adapter("trained")  # active adapter, trainable
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B.trained" in name:
                p.normal_(0, 0.5)
    lm.backend.mark_updated("trained")
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable, "the active adapter's weights train"
    assert lm.backend.generate([base_req])[0][0].token_ids == before
    assert {n for n, p in peft_model.named_parameters() if p.requires_grad} == trainable
    ids = torch.tensor([prompt])
    with torch.no_grad():
        with_adapter = peft_model(input_ids=ids).logits
        with peft_model.disable_adapter():
            plain = peft_model(input_ids=ids).logits
    assert not torch.allclose(with_adapter, plain), "the adapter is switched back on after the base pass"


def test_wrapping_in_peft_raises_no_deprecation_noise(tiny_model, smollm_tokenizer, tmp_path):
    """PEFT reads transformers' deprecated ``is_gradient_checkpointing`` when wrapping a model; hide that."""
    import copy
    import warnings

    unwrapped = copy.deepcopy(tiny_model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)
        lm.for_role("plan")
        lm.save_adapter(tmp_path / "plan", name="plan")
        fresh = LocalLM(unwrapped, tokenizer=smollm_tokenizer, max_tokens=4)
        fresh.load_adapter(tmp_path / "plan", name="plan")  # PeftModel.from_pretrained on an unwrapped model
    noisy = [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    assert not noisy, [str(w.message) for w in noisy]


def test_role_adapters_adapt_the_top_half_of_the_layers_by_default(lm):
    from rolecall.lm import default_lora_config

    assert default_lora_config(30).layers_to_transform == list(range(15, 30))
    assert default_lora_config(30, layers_to_transform=None).layers_to_transform is None
    assert default_lora_config().layers_to_transform is None  # no layer count: every layer
    lm.for_role("plan")
    adapted = {n.split(".layers.")[1].split(".")[0] for n, _ in lm.hf_model.named_parameters() if "lora_A" in n}
    assert adapted == {"1"}  # the tiny model has 2 layers: LoRA sits on the upper one only


def test_deleting_adapters_keeps_their_version_count_and_unwraps_after_the_last(lm, tmp_path):
    msgs = [{"role": "user", "content": "Hello"}]
    base = lm.sample(msgs, max_tokens=5)[0].token_ids
    plan = lm.for_role("plan")
    with torch.no_grad():
        for name, p in lm.hf_model.named_parameters():
            if ".plan." in name and "lora_B" in name:
                p.normal_(0, 0.5)
    lm.backend.mark_updated("plan")
    plan.save_adapter(tmp_path / "plan")
    trained = plan.sample(msgs, max_tokens=5)[0].token_ids
    assert trained != base
    version = lm.backend.adapter_versions["plan"]
    lm.backend.delete_adapter("plan")
    assert not lm.backend.is_peft and lm.sample(msgs, max_tokens=5)[0].token_ids == base  # the plain model again
    lm.for_role("plan")  # re-created as the identity: a fresh version, never one the prefix cache has seen
    assert lm.backend.adapter_versions["plan"] > version and plan.sample(msgs, max_tokens=5)[0].token_ids == base
    lm.backend.load_adapter("plan", tmp_path / "plan")
    assert plan.sample(msgs, max_tokens=5)[0].token_ids == trained
    with pytest.raises(ConfigError, match="No adapter named 'nope'"):
        lm.backend.delete_adapter("nope")
