"""Row-wise decode attention: the same outputs as transformers' SDPA on padded batches with holes, the stock path
where it does not pay, and unchanged generations when a model is switched to it."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rolecall.lm import attention
from rolecall.lm.attention import ROWWISE, _row_plan, rowwise_sdpa_forward, use_rowwise_attention
from rolecall.lm.generation import GenerationRequest, generate_batch


class _Attention(torch.nn.Module):
    """What the forward reads from an attention module: its GQA group count and training flag."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _mask(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)[:, None, None, :]


def _inputs(batch: int, width: int, heads: int = 6, kv_heads: int = 2, dim: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, 1, dim, generator=g)
    k = torch.randn(batch, kv_heads, width, dim, generator=g)
    v = torch.randn(batch, kv_heads, width, dim, generator=g)
    return q, k, v


def test_matches_sdpa_on_left_padding_and_holes():
    width = 12
    mask = _mask(
        [
            [1] * 12,  # the longest row
            [0] * 9 + [1] * 3,  # a short one
            [0] * 2 + [1] * 4 + [0] * 3 + [1] * 3,  # a cached prefix, then a padded suffix: a hole
            [0] * 5 + [1] * 7,
        ]
    )
    q, k, v = _inputs(4, width)
    module = _Attention(groups=3)
    assert _row_plan(mask) == [(0, False), (9, False), (2, True), (5, False)]
    got, _ = rowwise_sdpa_forward(module, q, k, v, mask, scaling=0.3)
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (4, 1, 6, 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_even_batches_prefill_and_no_mask_take_the_stock_path(monkeypatch):
    module = _Attention(groups=3)
    calls = []
    import transformers.integrations.sdpa_attention as stock

    real = stock.sdpa_attention_forward

    def counting(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(stock, "sdpa_attention_forward", counting)
    q, k, v = _inputs(3, 10)
    nearly_full = _mask([[1] * 10, [1] * 10, [0] + [1] * 9])  # 3% padding: one batched call is cheaper
    assert _row_plan(nearly_full) is None
    rowwise_sdpa_forward(module, q, k, v, nearly_full)
    rowwise_sdpa_forward(module, q, k, v, None)
    prefill_q = torch.randn(3, 6, 4, 8)  # four query positions: prefill
    rowwise_sdpa_forward(module, prefill_q, k, v, _mask([[0] * 6 + [1] * 4] * 3).expand(3, 1, 4, 10))
    assert len(calls) == 3


def test_generations_unchanged_when_a_model_switches_to_it(tiny_model, smollm_tokenizer, monkeypatch):
    """A batch of very uneven prompts decodes to the same tokens (greedy and seeded sampling) with the row-wise
    attention as with SDPA, and to what each prompt decodes to alone."""
    tok, model = smollm_tokenizer, tiny_model
    prompts = [
        tok.encode("Tell me everything about the river towns of the north. " * 10),
        tok.encode("Hi"),
        tok.encode("Who founded Orlen Vask Records?"),
    ]
    reqs = [
        GenerationRequest(prompts[0], max_tokens=12),
        GenerationRequest(prompts[1], max_tokens=12, n=2, temperature=0.9, seed=3),
        GenerationRequest(prompts[2], max_tokens=12),
    ]

    def tokens(batch):
        return [[c.token_ids for c in out] for out in generate_batch(model, tok, batch, min_shared_prefix=10**9)]

    stock = tokens(reqs)
    plans = []
    real_plan = attention._row_plan
    monkeypatch.setattr(attention, "_row_plan", lambda mask: plans.append(real_plan(mask)) or plans[-1])
    assert use_rowwise_attention(model) is True
    assert model.config._attn_implementation == ROWWISE
    rowwise = tokens(reqs)
    alone = [tokens([r])[0] for r in reqs]
    assert use_rowwise_attention(model, enabled=False) is False
    assert model.config._attn_implementation == "sdpa"
    assert rowwise == stock == alone
    assert any(plan is not None for plan in plans)  # the uneven batch did take the row-wise path


def test_models_on_other_attention_are_left_alone(tiny_model):
    model = tiny_model
    model.config._attn_implementation = "eager"
    assert use_rowwise_attention(model) is False
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtypes(dtype):
    q, k, v = (t.to(dtype) for t in _inputs(2, 6, seed=1))
    mask = _mask([[1] * 6, [0] * 4 + [1] * 2])
    got, _ = rowwise_sdpa_forward(_Attention(groups=3), q, k, v, mask)
    want, _ = sdpa_attention_forward(_Attention(groups=3), q, k, v, mask)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
