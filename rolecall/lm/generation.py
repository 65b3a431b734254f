"""One batched decoding pass over a causal LM: mixed sampling settings, LoRA adapters and n samples per prompt.

The loop is written out rather than delegated to ``model.generate`` because one batch mixes rows that differ in
temperature, top-p, stop strings, token budget, seed and LoRA adapter, and because the ``n`` samples of one prompt
share a single prefill: the prompt is encoded once and its KV cache is repeated ``n`` times before decoding.
Rows that finish are dropped from the cache so the batch shrinks as it goes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["GenerationRequest", "Completion", "generate_batch", "BASE_ADAPTER"]

logger = logging.getLogger(__name__)

KV = tuple[torch.Tensor, torch.Tensor]
"""One layer's cached ``(keys, values)``."""

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
        logprobs: return the log-probability of each generated token under the distribution it was drawn from:
            ``log_softmax(logits / temperature)`` (raw logits when greedy; top-p is not applied), as vLLM's
            ``logprobs_mode="processed_logprobs"`` reports it; what the trainer's temperature-scaled forward compares.
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


def _check_stop(tokenizer, row: _Row) -> None:
    """Mark ``row`` finished if its decoded tail contains one of its stop strings."""
    if not row.stop:
        return
    # decode only a tail long enough to hold any stop string, then map the hit back to the full text once
    longest = max(len(s) for s in row.stop)
    tail = tokenizer.decode(row.token_ids[-(longest + 8) :], skip_special_tokens=True)
    if any(s in tail for s in row.stop):
        text = tokenizer.decode(row.token_ids, skip_special_tokens=True)
        hits = [text.find(s) for s in row.stop if s in text]
        if hits:
            row.stop_at = min(hits)
            row.finish_reason = "stop"


def make_rows(requests: Sequence[GenerationRequest], adapters: Sequence[str], ids: Sequence[int]) -> list[_Row]:
    """The ``n`` sample rows of each request (``ids[i]`` becomes their ``request_index``), each with its own seeded
    sampler so its samples do not depend on what else shares the batch."""
    rows: list[_Row] = []
    for r, adapter, rid in zip(requests, adapters, ids, strict=True):
        for j in range(r.n):
            gen = None
            if r.temperature > 0:
                gen = torch.Generator(device="cpu")
                gen.manual_seed(r.seed + j if r.seed is not None else int(torch.randint(0, 2**62, (1,))))
            rows.append(_Row(rid, r.temperature, r.top_p, r.max_tokens, tuple(r.stop), gen, r.logprobs, adapter))
    return rows


def sample_step(tokenizer, rows: Sequence[_Row], logits: torch.Tensor, eos: set[int]) -> list[int]:
    """Pick each row's next token from ``logits`` (one row of logits per row), append it, and mark rows that finish
    (EOS, a stop string or the token budget). Returns the sampled tokens.

    A row that wants log-probs records its token's log-prob under the distribution it was sampled from,
    ``log_softmax(logits / temperature)`` in fp32 (the raw logits when greedy), as the trainer's forward computes it
    with ``TrainerConfig.temperature``."""
    next_tokens = [_sample(logits[b].cpu(), row) for b, row in enumerate(rows)]
    logprobs = _sampled_logprobs(rows, logits, next_tokens) if any(r.want_logprobs for r in rows) else None
    for b, (row, tok) in enumerate(zip(rows, next_tokens, strict=True)):
        # EOS stays in token_ids (a trained policy must learn to stop); decoding drops it from the text
        row.token_ids.append(tok)
        if logprobs is not None and row.want_logprobs:
            row.logprobs.append(logprobs[b])
        if tok in eos:
            row.finish_reason = "stop"
            continue
        _check_stop(tokenizer, row)
        if row.finish_reason is None and len(row.token_ids) >= row.max_tokens:
            row.finish_reason = "length"
    return next_tokens


def _sampled_logprobs(rows: Sequence[_Row], logits: torch.Tensor, tokens: Sequence[int]) -> list[float]:
    """log_softmax(logits / T)[token] of each row (T = 1 for greedy rows), in fp32."""
    scale = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows], device=logits.device)
    picked = torch.tensor(tokens, device=logits.device)[:, None]
    return torch.log_softmax(logits.float() / scale[:, None], dim=-1).gather(-1, picked)[:, 0].tolist()


def to_completion(tokenizer, row: _Row, prompt_tokens: int) -> Completion:
    """The finished ``row`` as a :class:`Completion` (text cut before its first stop string)."""
    text = tokenizer.decode(row.token_ids, skip_special_tokens=True)
    if row.stop_at is not None:
        text = text[: row.stop_at]
    return Completion(
        text=text,
        token_ids=list(row.token_ids),
        finish_reason=row.finish_reason or "length",
        logprobs=list(row.logprobs) if row.want_logprobs else None,
        prompt_tokens=prompt_tokens,
        tokens=tokenizer.convert_ids_to_tokens(row.token_ids) if row.want_logprobs else [],
    )


class _GrowableLayer:
    """Mixin body for a ``DynamicLayer`` that appends into preallocated slack instead of concatenating the whole cache
    on every decode step (``torch.cat`` copies every cached key and value once per generated token: at 16 rows of
    2k-token prompts that copy, not the model, dominates a CPU decode step)."""

    slack = 128

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held_k, held_v = self.keys, self.values
        n = held_k.shape[-2] if held_k.numel() else 0
        new, batch = key_states.shape[-2], key_states.shape[0]
        buf_k = getattr(self, "_buf_k", None)
        # the buffer is still ours unless someone replaced ``keys`` (reorder, crop, select) since the last update; it
        # may hold spare batch rows beyond ``batch`` (room for rows the continuous batcher admits in place)
        ours = buf_k is not None and held_k is getattr(self, "_view_k", None)
        if not (ours and buf_k.shape[0] >= batch and n + new <= buf_k.shape[-2]):
            rows = max(batch, buf_k.shape[0]) if ours else batch
            shape = (rows, key_states.shape[1], n + new + self.slack, key_states.shape[-1])
            self._buf_k = key_states.new_empty(shape)
            self._buf_v = value_states.new_empty((*shape[:3], value_states.shape[-1]))
            if n:
                self._buf_k[:batch, :, :n] = held_k
                self._buf_v[:batch, :, :n] = held_v
        self._buf_k[:batch, :, n : n + new] = key_states
        self._buf_v[:batch, :, n : n + new] = value_states
        self.keys = self._view_k = self._buf_k[:batch, :, : n + new]
        self.values = self._buf_v[:batch, :, : n + new]
        return self.keys, self.values

    def adopt(self, buf_k: torch.Tensor, buf_v: torch.Tensor, length: int, rows: int | None = None) -> None:
        """Hold the first ``rows`` batch rows (default: all) and ``length`` positions of the given buffers; later
        updates append into the rest."""
        if not self.is_initialized:
            self.lazy_initialization(buf_k, buf_v)
        rows = buf_k.shape[0] if rows is None else rows
        self._buf_k, self._buf_v = buf_k, buf_v
        self.keys = self._view_k = buf_k[:rows, :, :length]
        self.values = buf_v[:rows, :, :length]

    @property
    def row_capacity(self) -> int:
        """Batch rows the buffers hold, used or not (0 before the first update)."""
        buf_k = getattr(self, "_buf_k", None)
        return 0 if buf_k is None or self.keys is not getattr(self, "_view_k", None) else buf_k.shape[0]


@functools.cache
def _growable_cache_class() -> type:
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    layer_cls = type("GrowableLayer", (_GrowableLayer, DynamicLayer), {})

    class GrowableCache(DynamicCache):
        """A ``DynamicCache`` of growable layers."""

        def __init__(self) -> None:
            Cache.__init__(self, layer_class_to_replicate=layer_cls)

    return GrowableCache


def new_cache() -> Any:
    """An empty KV cache whose layers grow into preallocated slack (see :class:`_GrowableLayer`)."""
    return _growable_cache_class()()


def _cache_kwarg(model) -> str:
    """Name of the KV-cache argument: ``cache`` in transformers 5, ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _cache_kwarg_of(type(base))


@functools.cache
def _cache_kwarg_of(model_class: type) -> str:
    # per class, once: the continuous batcher asks on every decode step
    import inspect

    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


_TUNER_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tuner_layers(model) -> list[Any]:
    """The PEFT tuner (LoRA) layers of ``model``, listed once per model and adapter count."""
    count = len(model.peft_config)
    cached = _TUNER_LAYERS.get(model)
    if cached is None or cached[0] != count:
        from peft.tuners.tuners_utils import BaseTunerLayer

        cached = (count, [m for m in model.modules() if isinstance(m, BaseTunerLayer)])
        _TUNER_LAYERS[model] = cached
    return cached[1]


@contextlib.contextmanager
def _adapter_pass(model, adapters: Sequence[str]) -> Iterator[dict]:
    """The forward kwargs that run each batch row under its adapter (``adapter_names``; nothing for a plain model).

    A batch wholly on the base model (every untrained adapter is routed there) instead switches the LoRA layers off
    for the pass: PEFT's mixed-adapter path walks every module and hooks every LoRA layer on each forward, a tenth of
    a CPU decode step. The flag is flipped directly because PEFT's ``disable_adapter()`` also resets which adapters
    require grad, which a trainer relies on; callers hold the backend lock, so no other forward sees the switch.
    """
    if not hasattr(model, "peft_config"):
        yield {}
        return
    if any(a != BASE_ADAPTER for a in adapters):
        yield {"adapter_names": list(adapters)}
        return
    layers = _tuner_layers(model)
    saved = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield {}
    finally:
        for layer, flag in zip(layers, saved, strict=True):
            layer._disable_adapters = flag


def pad_token_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS token."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


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


def encode_prefix(model, prompt_ids: Sequence[int], adapter: str, cache_kw: str, device) -> list[KV]:
    """The KV cache of ``prompt_ids`` (positions from 0) under ``adapter``, one ``(keys, values)`` pair per layer, each
    of shape (1, heads, len, head_dim). A causal model's cache of a prefix does not depend on what follows it, so the
    result can be sliced to any shorter prefix."""
    from transformers import DynamicCache

    n = len(prompt_ids)
    with _adapter_pass(model, [adapter]) as adapter_kw:
        out = model(
            input_ids=torch.tensor([list(prompt_ids)], dtype=torch.long, device=device),
            position_ids=torch.arange(n, device=device).unsqueeze(0),
            use_cache=True,
            logits_to_keep=1,
            **{cache_kw: DynamicCache()},
            **adapter_kw,
        )
    cache = getattr(out, cache_kw)
    return [_layer_kv(cache, layer) for layer in range(_num_layers(cache))]


def pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` left-padded with zeros along ``dim`` to ``width``."""
    pad = width - t.shape[dim]
    if pad <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = pad
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _runs(rows: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(first destination index, first source row, length)`` of each run of consecutive source rows."""
    runs: list[tuple[int, int, int]] = []
    for dst, src in enumerate(rows):
        if runs and runs[-1][1] + runs[-1][2] == src:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((dst, src, 1))
    return runs


def assemble_cache(
    parts: Sequence[tuple[Sequence[KV], Sequence[int] | None, int]], extra: int = 0, row_capacity: int = 0
) -> Any:
    """One growable KV cache whose batch rows are the rows of several caches, copied once.

    Each part is ``(layers, rows, start)``: its per-layer ``(keys, values)``, the batch rows to keep (None: all) and
    the leading positions to drop. Parts are stacked in order, each right-aligned to the widest and left-padded with
    zeros, into buffers with room for ``extra`` more positions plus the growable slack, and for ``row_capacity`` batch
    rows when that is more than the parts hold (spare rows left uninitialised). Selecting, trimming, padding
    and concatenating this way copies each kept key and value once, where ``index_select`` + ``cat`` + a fresh cache
    copied them three times (at 32 rows of 1.5k-token prompts that is a gigabyte per admission).
    """
    widths = [layers[0][0].shape[2] - start for layers, _, start in parts]
    width = max(widths)
    counts = [layers[0][0].shape[0] if rows is None else len(rows) for layers, rows, _ in parts]
    template = parts[0][0]
    cache = new_cache()
    capacity = width + extra + _GrowableLayer.slack
    for layer in range(len(template)):
        k0, v0 = template[layer]
        total = max(sum(counts), row_capacity)
        buf_k = k0.new_empty((total, k0.shape[1], capacity, k0.shape[3]))
        buf_v = v0.new_empty((total, v0.shape[1], capacity, v0.shape[3]))
        r0 = 0
        for (layers, rows, start), w, count in zip(parts, widths, counts, strict=True):
            k, v = layers[layer]
            c0 = width - w
            if c0:
                buf_k[r0 : r0 + count, :, :c0].zero_()
                buf_v[r0 : r0 + count, :, :c0].zero_()
            for dst, src, n in [(0, 0, count)] if rows is None else _runs(rows):
                buf_k[r0 + dst : r0 + dst + n, :, c0:width].copy_(k[src : src + n, :, start:])
                buf_v[r0 + dst : r0 + dst + n, :, c0:width].copy_(v[src : src + n, :, start:])
            r0 += count
        cache.layers.append(cache.layer_class_to_replicate())
        cache.layers[-1].adopt(buf_k, buf_v, width, rows=sum(counts))
    return cache


def cache_layers(cache) -> list[KV]:
    """The per-layer ``(keys, values)`` of a ``DynamicCache``."""
    return [_layer_kv(cache, layer) for layer in range(_num_layers(cache))]


def stack_prefixes(prefixes: Sequence[list[KV] | None], device, extra: int = 0) -> tuple[Any, torch.Tensor, list[int]]:
    """One batched cache from per-request prefix caches (None: no prefix), left-padded to the longest, with room for
    ``extra`` more positions (the prompts' own suffixes) before its buffers must grow.

    Returns ``(cache, mask, lengths)``: ``mask`` (R, L) is 0 on the padding; ``lengths`` is each request's prefix
    length.
    """

    lengths = [0 if p is None else p[0][0].shape[2] for p in prefixes]
    width = max(lengths, default=0)
    if width == 0:
        return new_cache(), torch.ones((len(prefixes), 0), dtype=torch.long, device=device), lengths
    template = next(p for p in prefixes if p is not None)
    empty = [
        (k.new_empty((1, k.shape[1], 0, k.shape[3])), v.new_empty((1, v.shape[1], 0, v.shape[3]))) for k, v in template
    ]
    cache = assemble_cache([(empty if p is None else p, None, 0) for p in prefixes], extra=extra)
    mask = torch.zeros((len(prefixes), width), dtype=torch.long, device=device)
    for i, n in enumerate(lengths):
        if n:
            mask[i, width - n :] = 1
    return cache, mask, lengths


def _shared_prefixes(model, requests, adapters, min_shared: int, cache_kw: str, device) -> list[list[KV] | None]:
    """Encode, once per group of requests (same adapter, or same ``prefix_group``), the prefix the group shares;
    each request gets its group's prefix cache, or None."""
    group_keys = [f"{a}\x00{r.prefix_group or ''}" for r, a in zip(requests, adapters, strict=True)]
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(group_keys):
        groups.setdefault(key, []).append(i)
    prefixes: list[list[KV] | None] = [None] * len(requests)
    for members in groups.values():
        if len(members) < 2:
            continue
        n = _common_prefix_length([requests[i].prompt_ids for i in members])
        if n < max(min_shared, 1):
            continue
        kv = encode_prefix(model, requests[members[0]].prompt_ids[:n], adapters[members[0]], cache_kw, device)
        for i in members:
            prefixes[i] = kv
    return prefixes


def prefill(
    model, tokenizer, requests: Sequence[GenerationRequest], adapters: Sequence[str], prefixes, cache_kw: str, device
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode each prompt after its cached prefix (``prefixes[i]``, or None) and expand it to its ``n`` sample rows.

    Returns ``(cache, attention, next_pos, logits)`` with one batch row per sample row, in request order: the KV
    cache, the attention mask over it, each row's next position id, and the logits of its first token.
    """
    pad_id = pad_token_id(tokenizer)
    shared = [0 if p is None else p[0][0].shape[2] for p in prefixes]
    suffixes = [r.prompt_ids[n:] for r, n in zip(requests, shared, strict=True)]
    width = max(len(x) for x in suffixes)
    cache, attention, _ = stack_prefixes(prefixes, device, extra=width)
    input_ids = torch.full((len(requests), width), pad_id, dtype=torch.long)
    suffix_mask = torch.zeros((len(requests), width), dtype=torch.long)
    for i, suffix in enumerate(suffixes):
        input_ids[i, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        suffix_mask[i, width - len(suffix) :] = 1
    attention = torch.cat([attention, suffix_mask.to(device)], dim=1)  # (R, prefix + width)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with _adapter_pass(model, adapters) as adapter_kw:
        out = model(
            input_ids=input_ids.to(device),
            attention_mask=attention,
            position_ids=positions[:, attention.shape[1] - width :],
            use_cache=True,
            logits_to_keep=1,  # only the last position's logits are needed: skips a (R, T, V) projection
            **{cache_kw: cache},
            **adapter_kw,
        )
    # the n samples of a prompt share its prefill: repeat its cache row n times
    expand = torch.tensor([i for i, r in enumerate(requests) for _ in range(r.n)], device=device)
    cache = getattr(out, cache_kw)
    if len(expand) > len(requests):  # (one sample per prompt keeps the cache as it is: no copy)
        cache.reorder_cache(expand)
    next_pos = positions[:, -1].index_select(0, expand) + 1
    logits = out.logits[:, -1, :].index_select(0, expand).float()  # (B, V)
    return cache, attention.index_select(0, expand), next_pos, logits


def decode_step(model, cache, attention, next_pos, tokens: Sequence[int], adapters: Sequence[str], cache_kw: str):
    """Feed one token per row; returns the updated ``(cache, attention, next_pos, logits)``."""
    device = attention.device
    attention = torch.cat([attention, attention.new_ones((len(tokens), 1))], dim=1)
    with _adapter_pass(model, adapters) as adapter_kw:
        out = model(
            input_ids=torch.tensor(list(tokens), device=device).unsqueeze(1),
            attention_mask=attention,
            position_ids=next_pos.unsqueeze(1),
            use_cache=True,
            **{cache_kw: cache},
            **adapter_kw,
        )
    return getattr(out, cache_kw), attention, next_pos + 1, out.logits[:, -1, :].float()


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

    # 1) prefill every distinct prompt once: the prefix a group of prompts shares (a DSPy signature's instructions and
    #    demos) is encoded once per group, then each prompt's own suffix, left-padded after the shared prefix; the n
    #    samples of a prompt share its prefill
    adapters = [r.adapter or BASE_ADAPTER for r in requests]
    cache_kw = _cache_kwarg(model)
    prefixes = _shared_prefixes(model, requests, adapters, min_shared_prefix, cache_kw, device)
    cache, attention, next_pos, logits = prefill(model, tokenizer, requests, adapters, prefixes, cache_kw, device)
    rows = make_rows(requests, adapters, range(len(requests)))
    active = list(range(len(rows)))  # indices into rows, aligned with the batch dimension

    # 2) decode until every row has finished; finished rows leave the cache so the batch shrinks
    while active:
        next_tokens = sample_step(tokenizer, [rows[a] for a in active], logits, eos)
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
        cache, attention, next_pos, logits = decode_step(
            model, cache, attention, next_pos, next_tokens, [rows[a].adapter for a in active], cache_kw
        )

    # 3) assemble completions in request order
    results: list[list[Completion]] = [[] for _ in requests]
    for row in rows:
        results[row.request_index].append(to_completion(tokenizer, row, len(requests[row.request_index].prompt_ids)))
    return results
