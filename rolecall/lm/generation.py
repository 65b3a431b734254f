"""One batched decoding pass over a causal LM: mixed sampling settings, LoRA adapters and n samples per prompt.

The loop is written out rather than delegated to ``model.generate`` because one batch mixes rows that differ in
temperature, top-p, stop strings, token budget, seed and LoRA adapter, and because the ``n`` samples of one prompt
share a single prefill: the prompt is encoded once and its KV cache is repeated ``n`` times before decoding.
Rows that finish are dropped from the cache so the batch shrinks as it goes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["GenerationRequest", "Completion", "generate_batch", "BASE_ADAPTER"]

logger = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"
"""PEFT's name for "no adapter" inside a mixed-adapter batch."""


@dataclass
class GenerationRequest:
    """One prompt to complete ``n`` times.

    Attributes:
        prompt_ids: the tokenized prompt (chat template already applied).
        n: number of samples; they share one prefill.
        temperature: 0 means greedy.
        top_p: nucleus sampling mass (1.0 disables it).
        max_tokens: token budget of each completion.
        stop: strings that end a completion; the text is cut before the first one.
        seed: seeds this request's own sampler, so its samples do not depend on what else is in the batch.
        logprobs: return the log-probability of each generated token under the model (temperature 1, no top-p).
        adapter: LoRA adapter name, or None for the base model.
        prefix_group: requests of one group share their common prompt prefix's prefill (default: the adapter name;
            the backend keeps a role's group when it runs an untrained adapter as the base model).
    """

    prompt_ids: list[int]
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    adapter: str | None = None
    prefix_group: str | None = None


@dataclass
class Completion:
    """One generated completion."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    logprobs: list[float] | None = None
    prompt_tokens: int = 0
    tokens: list[str] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.token_ids)


@dataclass
class _Row:
    request_index: int
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]
    generator: torch.Generator | None
    want_logprobs: bool
    adapter: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_at: int | None = None  # character offset of the first stop string in the decoded text


def _sample(logits: torch.Tensor, row: _Row) -> int:
    """Pick the next token of one row from its logits (V,)."""
    if row.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / row.temperature, dim=-1)
    if row.top_p < 1.0:
        sorted_probs, sorted_idx = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        remove = cumulative - sorted_probs > row.top_p
        sorted_probs[remove] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, sorted_idx, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=row.generator))


def _check_stop(tokenizer, row: _Row, max_stop_chars: int) -> None:
    """Mark ``row`` finished if its decoded tail contains one of its stop strings."""
    if not row.stop:
        return
    # decode only a tail long enough to hold any stop string, then map the hit back to the full text once
    tail = tokenizer.decode(row.token_ids[-(max_stop_chars + 8) :], skip_special_tokens=True)
    if any(s in tail for s in row.stop):
        text = tokenizer.decode(row.token_ids, skip_special_tokens=True)
        hits = [text.find(s) for s in row.stop if s in text]
        if hits:
            row.stop_at = min(hits)
            row.finish_reason = "stop"


def _cache_kwarg(model) -> str:
    """Name of the KV-cache argument: ``cache`` in transformers 5, ``past_key_values`` before."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _adapter_kwargs(model, adapters: Sequence[str]) -> dict:
    """``adapter_names`` for a PEFT model (mixed-adapter batch); nothing for a plain model."""
    if not hasattr(model, "peft_config"):
        return {}
    return {"adapter_names": list(adapters)}


def _common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix shared by all prompts, leaving each prompt at least one token of its own."""
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return max(n, 0)


def _layer_kv(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def _num_layers(cache) -> int:
    return len(cache.layers) if hasattr(cache, "layers") else len(cache.key_cache)


def _prefill_shared_prefixes(model, requests, adapters, min_shared: int, cache_kw: str, device):
    """Encode, once per group of requests (same adapter, or same ``prefix_group``), the prefix the group shares.

    Returns ``(cache, prefix_mask, shared)``: a KV cache with one row per request holding its group's prefix,
    left-padded to the longest prefix (``prefix_mask`` (R, L) is 0 on the padding), and each request's prefix length.
    """
    from transformers import DynamicCache

    group_keys = [f"{a}\x00{r.prefix_group or ''}" for r, a in zip(requests, adapters, strict=True)]
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(group_keys):
        groups.setdefault(key, []).append(i)
    shared = [0] * len(requests)
    for members in groups.values():
        if len(members) > 1:
            n = _common_prefix_length([requests[i].prompt_ids for i in members])
            for i in members:
                shared[i] = n if n >= min_shared else 0
    width = max(shared)
    if width == 0:
        return DynamicCache(), torch.ones((len(requests), 0), dtype=torch.long, device=device), shared
    prefix_kv: dict[str, DynamicCache] = {}
    for key, members in groups.items():
        n = shared[members[0]]
        if n == 0:
            continue
        adapter = adapters[members[0]]
        out = model(
            input_ids=torch.tensor([requests[members[0]].prompt_ids[:n]], dtype=torch.long, device=device),
            position_ids=torch.arange(n, device=device).unsqueeze(0),
            use_cache=True,
            logits_to_keep=1,
            **{cache_kw: DynamicCache()},
            **_adapter_kwargs(model, [adapter]),
        )
        prefix_kv[key] = getattr(out, cache_kw)
    layers = _num_layers(next(iter(prefix_kv.values())))
    cache = DynamicCache()
    for layer in range(layers):
        keys, values = [], []
        for i, key in enumerate(group_keys):
            if shared[i] == 0:
                k0, v0 = _layer_kv(next(iter(prefix_kv.values())), layer)
                k = k0.new_zeros((1, k0.shape[1], width, k0.shape[3]))
                v = v0.new_zeros((1, v0.shape[1], width, v0.shape[3]))
            else:
                k, v = _layer_kv(prefix_kv[key], layer)
                pad = width - k.shape[2]
                if pad:
                    k = torch.cat([k.new_zeros((1, k.shape[1], pad, k.shape[3])), k], dim=2)
                    v = torch.cat([v.new_zeros((1, v.shape[1], pad, v.shape[3])), v], dim=2)
            keys.append(k)
            values.append(v)
        cache.update(torch.cat(keys, 0), torch.cat(values, 0), layer)
    mask = torch.zeros((len(requests), width), dtype=torch.long, device=device)
    for i, n in enumerate(shared):
        if n:
            mask[i, width - n :] = 1
    return cache, mask, shared


@torch.inference_mode()
def generate_batch(
    model,
    tokenizer,
    requests: Sequence[GenerationRequest],
    *,
    eos_token_ids: Sequence[int] | None = None,
    min_shared_prefix: int = 32,
) -> list[list[Completion]]:
    """Complete every request in one padded, batched decoding loop.

    Args:
        model: a causal LM (``transformers`` or a PEFT model wrapping one) in eval mode.
        tokenizer: its tokenizer (``pad_token_id`` must be set).
        requests: the prompts and their sampling settings.
        eos_token_ids: token ids that end a completion; defaults to the tokenizer's EOS.
        min_shared_prefix: a prefix common to every prompt is encoded once (per adapter) when it is at least this
            many tokens long.

    Returns:
        For each request, its ``n`` completions in order.
    """
    if not requests:
        return []
    device = next(model.parameters()).device
    eos = set(eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    # 1) prefill every distinct prompt once: the prefix all prompts share (a DSPy signature's instructions and demos)
    #    is encoded once per adapter, then each prompt's own suffix, left-padded after the shared prefix
    adapters = [r.adapter or BASE_ADAPTER for r in requests]
    cache_kw = _cache_kwarg(model)
    cache, attention, shared = _prefill_shared_prefixes(model, requests, adapters, min_shared_prefix, cache_kw, device)
    suffixes = [r.prompt_ids[n:] for r, n in zip(requests, shared, strict=True)]
    lengths = [len(r.prompt_ids) for r in requests]
    width = max(len(x) for x in suffixes)
    input_ids = torch.full((len(requests), width), pad_id, dtype=torch.long)
    suffix_mask = torch.zeros((len(requests), width), dtype=torch.long)
    for i, suffix in enumerate(suffixes):
        input_ids[i, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        suffix_mask[i, width - len(suffix) :] = 1
    input_ids = input_ids.to(device)
    attention = torch.cat([attention, suffix_mask.to(device)], dim=1)  # (R, shared + width)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions[:, attention.shape[1] - width :],
        use_cache=True,
        logits_to_keep=1,  # only the last position's logits are needed: skips a (R, T, V) projection
        **{cache_kw: cache},
        **_adapter_kwargs(model, adapters),
    )
    last_logits = out.logits[:, -1, :]  # (R, V)

    # 2) expand each prompt to its n sample rows, sharing the prefill's KV cache
    expand = torch.tensor([i for i, r in enumerate(requests) for _ in range(r.n)], device=device)
    cache = getattr(out, cache_kw)
    cache.reorder_cache(expand)
    attention = attention.index_select(0, expand)
    next_pos = positions[:, -1].index_select(0, expand) + 1
    logits = last_logits.index_select(0, expand).float()  # (B, V)
    rows: list[_Row] = []
    for i, r in enumerate(requests):
        for j in range(r.n):
            gen = None
            if r.temperature > 0:
                gen = torch.Generator(device="cpu")
                gen.manual_seed(r.seed + j if r.seed is not None else int(torch.randint(0, 2**62, (1,))))
            rows.append(_Row(i, r.temperature, r.top_p, r.max_tokens, tuple(r.stop), gen, r.logprobs, adapters[i]))
    max_stop_chars = max((len(s) for r in requests for s in r.stop), default=0)
    active = list(range(len(rows)))  # indices into rows, aligned with the batch dimension

    # 3) decode until every row has finished
    while active:
        logprobs = torch.log_softmax(logits, dim=-1) if any(rows[a].want_logprobs for a in active) else None
        next_tokens = []
        for b, a in enumerate(active):
            row = rows[a]
            tok = _sample(logits[b].cpu(), row)
            next_tokens.append(tok)
            # EOS stays in token_ids (a trained policy must learn to stop); decoding drops it from the text
            row.token_ids.append(tok)
            if logprobs is not None and row.want_logprobs:
                row.logprobs.append(float(logprobs[b, tok]))
            if tok in eos:
                row.finish_reason = "stop"
                continue
            _check_stop(tokenizer, row, max_stop_chars)
            if row.finish_reason is None and len(row.token_ids) >= row.max_tokens:
                row.finish_reason = "length"
        keep = [b for b, a in enumerate(active) if rows[a].finish_reason is None]
        if not keep:
            break
        if len(keep) < len(active):
            keep_idx = torch.tensor(keep, device=device)
            cache.reorder_cache(keep_idx)
            attention = attention.index_select(0, keep_idx)
            next_pos = next_pos.index_select(0, keep_idx)
            next_tokens = [next_tokens[b] for b in keep]
            active = [active[b] for b in keep]
        step_ids = torch.tensor(next_tokens, device=device).unsqueeze(1)  # (B, 1)
        attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=1)
        out = model(
            input_ids=step_ids,
            attention_mask=attention,
            position_ids=next_pos.unsqueeze(1),
            use_cache=True,
            **{cache_kw: cache},
            **_adapter_kwargs(model, [rows[a].adapter for a in active]),
        )
        cache = getattr(out, cache_kw)
        next_pos = next_pos + 1
        logits = out.logits[:, -1, :].float()

    # 4) assemble completions in request order
    results: list[list[Completion]] = [[] for _ in requests]
    for row in rows:
        text = tokenizer.decode(row.token_ids, skip_special_tokens=True)
        if row.stop_at is not None:
            text = text[: row.stop_at]
        results[row.request_index].append(
            Completion(
                text=text,
                token_ids=list(row.token_ids),
                finish_reason=row.finish_reason or "length",
                logprobs=list(row.logprobs) if row.want_logprobs else None,
                prompt_tokens=lengths[row.request_index],
                tokens=tokenizer.convert_ids_to_tokens(row.token_ids) if row.want_logprobs else [],
            )
        )
    return results
