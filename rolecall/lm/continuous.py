"""Continuous batching: requests join a running decode as they arrive and leave it as soon as they finish.

The static :class:`~rolecall.lm.batching.RequestBatcher` runs one batch until its longest completion is done, so a
request that arrives meanwhile waits a whole batch, and a program that makes ten sequential role calls per question
waits ten batch rounds. :class:`ContinuousBatcher` keeps one decoding loop going instead. Before every decode step it
admits whatever has been queued (prefilling the newcomers and left-padding their KV cache into the running one), and a
request's future resolves the step its last sample finishes.

Prompts of one role share their instructions and demos. :class:`PrefixCache` keeps the KV cache of such prefixes
across batches, keyed by adapter, adapter version and prompt group (:func:`~rolecall.lm.local.prompt_group`), so each
role's prompt header is encoded once rather than once per batch. A cached prefix is sliced to the part a new prompt
shares (a causal model's cache of a prefix does not depend on what follows it), so the cache converges on each role's
common header by itself.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from rolecall.lm.batching import QueueBatcher
from rolecall.lm.generation import (
    BASE_ADAPTER,
    KV,
    GenerationRequest,
    _cache_kwarg,
    _common_prefix_length,
    _Row,
    assemble_cache,
    cache_layers,
    decode_step,
    encode_prefix,
    make_rows,
    pad_left,
    pad_token_id,
    prefill,
    sample_step,
    to_completion,
)

__all__ = ["ContinuousBatcher", "ContinuousStats", "PrefixCache"]

logger = logging.getLogger(__name__)


def _kv_bytes(layers: Sequence[KV]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


def _shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists (a binary search over slice comparisons, which run in C)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class _Entry:
    tokens: list[int]
    layers: list[KV]
    nbytes: int


class PrefixCache:
    """KV caches of prompt prefixes kept across batches, least recently used first out.

    Entries are grouped by a key (the adapter, its version and the prompt group: a trained adapter's old prefixes are
    dropped when its version moves on, and one role's header is never cut down to what it shares with another role's).
    A lookup returns the entry sharing the longest prefix with the prompt, sliced to that prefix.

    Args:
        max_bytes: memory the cached keys and values may take in all.
        min_shared: shortest shared prefix worth reusing (in tokens).
        max_entries: most prefixes kept (a lookup compares the prompt with each entry of its key).
    """

    def __init__(self, max_bytes: int = 1 << 30, min_shared: int = 32, max_entries: int = 128) -> None:
        self.max_bytes = max_bytes
        self.min_shared = min_shared
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[Any, int], _Entry] = OrderedDict()
        self._next_id = 0
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, entry_key: tuple[Any, int]) -> None:
        self.nbytes -= self._entries.pop(entry_key).nbytes

    def drop_stale(self, name: str, version: int) -> None:
        """Forget the prefixes of adapter ``name`` at any version other than ``version``."""
        for entry_key in [k for k in self._entries if k[0][0] == name and k[0][1] != version]:
            self._drop(entry_key)

    def lookup(self, key: Any, prompt_ids: Sequence[int]) -> list[KV] | None:
        """The cached KV of the longest prefix of ``prompt_ids`` (leaving it at least one token of its own) that an
        entry under ``key`` shares, when it is at least ``min_shared`` tokens; None otherwise.

        An entry longer than what the prompt shares is cut down to the shared part: it held one prompt's own tail, and
        the part two prompts share is the part later prompts of that role will share too.
        """
        prompt_ids = list(prompt_ids)
        limit = len(prompt_ids) - 1
        head = prompt_ids[: self.min_shared]
        best, best_n = None, 0
        for entry_key, entry in self._entries.items():
            if entry_key[0] != key or entry.tokens[: self.min_shared] != head:
                continue
            n = min(_shared_length(entry.tokens, prompt_ids), limit)
            if n > best_n:
                best, best_n = entry_key, n
        if best is None or best_n < self.min_shared:
            self.misses += 1
            return None
        self.hits += 1
        self.reused_tokens += best_n
        entry = self._entries[best]
        self._entries.move_to_end(best)
        if best_n < len(entry.tokens):
            layers = [(k[:, :, :best_n].clone(), v[:, :, :best_n].clone()) for k, v in entry.layers]
            self.nbytes -= entry.nbytes
            entry.tokens, entry.layers, entry.nbytes = entry.tokens[:best_n], layers, _kv_bytes(layers)
            self.nbytes += entry.nbytes
        return entry.layers

    def store(self, key: Any, tokens: Sequence[int], layers: list[KV]) -> None:
        """Keep ``layers`` (the KV of ``tokens``) under ``key``, evicting the least recently used entries if needed."""
        nbytes = _kv_bytes(layers)
        if nbytes > self.max_bytes or len(tokens) < self.min_shared:
            return
        while self._entries and (self.nbytes + nbytes > self.max_bytes or len(self._entries) >= self.max_entries):
            self._drop(next(iter(self._entries)))
        self._entries[(key, self._next_id)] = _Entry(list(tokens), layers, nbytes)
        self._next_id += 1
        self.nbytes += nbytes

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
        self.nbytes = 0


@dataclass
class ContinuousStats:
    """Counters of what the continuous batcher did (for benchmarks and logs)."""

    steps: int = 0
    admissions: int = 0
    requests: int = 0
    rows: int = 0
    max_rows: int = 0
    row_steps: int = 0
    prefill_tokens: int = 0
    in_place_merges: int = 0
    copied_merges: int = 0

    @property
    def batches(self) -> int:
        """Prefill batches run (one per admission of newly queued requests)."""
        return self.admissions

    @property
    def mean_rows(self) -> float:
        """Mean number of sample rows per decode step."""
        return self.row_steps / self.steps if self.steps else 0.0


@dataclass
class _Job:
    request: GenerationRequest
    future: Future
    rows: list[_Row] = field(default_factory=list)


class ContinuousBatcher(QueueBatcher):
    """One decoding loop that requests from many threads join and leave step by step.

    It offers the same ``submit`` / ``generate`` / ``close`` / ``stats`` interface as
    :class:`~rolecall.lm.batching.RequestBatcher` (both are :class:`~rolecall.lm.batching.QueueBatcher`).

    Args:
        backend: the :class:`~rolecall.lm.backend.ModelBackend` whose model, tokenizer and lock it uses (read on every
            step: the model object changes when the first LoRA adapter is added).
        max_batch_rows: most sample rows decoded together; a request that would exceed it waits for rows to finish
            (a single larger request runs alone).
        max_wait_ms: when the loop is idle, how long it waits after the first request for others to join it.
        min_shared_prefix: shortest prompt prefix worth caching and reusing (tokens).
        prefix_cache_mb: memory the prefix cache may take (0 disables it).
        in_place_merge: write newcomers into the running batch's free rows where they fit, instead of copying the
            whole batch into new buffers at every admission (False: always copy; kept for benchmarks).

    The backend's lock is held for each admission and each decode step, not for a whole completion, so a trainer can
    update an adapter between two steps; rows already decoding then finish with the updated weights.
    """

    def __init__(
        self,
        backend: Any,
        *,
        max_batch_rows: int = 32,
        max_wait_ms: float = 15.0,
        min_shared_prefix: int = 32,
        prefix_cache_mb: float = 1024.0,
        in_place_merge: bool = True,
    ) -> None:
        super().__init__(max_batch_rows=max_batch_rows, max_wait_ms=max_wait_ms)
        self.backend = backend
        self.min_shared_prefix = min_shared_prefix
        self.in_place_merge = in_place_merge
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20), min_shared=min_shared_prefix)
        self.stats = ContinuousStats()
        self._waiting: list[tuple[GenerationRequest, Future]] = []
        self._closing = False
        # the running batch: rows aligned with the batch dimension of the cache, mask, positions and logits
        self._rows: list[_Row] = []
        self._live: list[bool] = []  # False for a finished row still in the batch, until the next compaction
        self._jobs: dict[int, _Job] = {}
        self._next_job = 0
        self._cache: Any = None
        self._attention: torch.Tensor | None = None
        self._next_pos: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None
        self._start("rolecall-continuous-batcher")

    # ------------------------------------------------------------------ the loop
    def _gather(self) -> list[tuple[GenerationRequest, Future]]:
        """Queued requests that fit in the running batch (blocking while there is nothing to do)."""
        if not self._rows and not self._waiting and not self._closing:
            self._receive()
            if not self._closing:
                deadline = time.monotonic() + self.max_wait_s
                while (timeout := deadline - time.monotonic()) > 0:
                    if not self._receive(timeout=timeout) or self._closing:
                        break
        while self._receive(block=False):
            pass
        admitted, rows = [], sum(self._live)  # finished rows leave the batch when newcomers are merged in
        while self._waiting and (rows + self._waiting[0][0].n <= self.max_batch_rows or rows == 0):
            item = self._waiting.pop(0)
            admitted.append(item)
            rows += item[0].n
        return admitted

    def _receive(self, block: bool = True, timeout: float | None = None) -> bool:
        """Take the next queued item (as :meth:`_get`): a request joins ``_waiting``, the close signal sets
        ``_closing``. False when nothing came in time."""
        try:
            item = self._get(block=block, timeout=timeout)
        except queue.Empty:
            return False
        if item is None:
            self._closing = True
        else:
            self._waiting.append(item)
        return True

    def _loop(self) -> None:
        while True:
            admitted = self._gather()
            if not admitted and not self._rows:
                if self._closing and not self._waiting:
                    return
                continue
            done: list[_Job] = []
            with self.backend.generating() as model:  # lock, eval and inference mode for this step only
                if admitted:
                    self._admit(model, admitted)
                if self._rows:
                    done = self._step(model)
            for job in done:
                job.future.set_result(
                    [to_completion(self.backend.tokenizer, row, len(job.request.prompt_ids)) for row in job.rows]
                )

    # ------------------------------------------------------------------ admission
    def _prefixes(self, model, requests: Sequence[GenerationRequest], adapters: Sequence[str], cache_kw, device):
        """Each request's cached prompt prefix, encoding the missing ones (once per group of prompts that share one)."""
        versions = {a: self.backend.adapter_versions.get(a, 0) for a in set(adapters)}
        for a, v in versions.items():
            self.prefix_cache.drop_stale(a, v)
        # grouped by prompt family too: a lookup must not cut one role's cached header down to the few tokens it
        # shares with another role's prompt
        keys = [(a, versions[a], r.prefix_group) for a, r in zip(adapters, requests, strict=True)]
        prefixes: list[list[KV] | None] = [
            self.prefix_cache.lookup(k, r.prompt_ids) for k, r in zip(keys, requests, strict=True)
        ]
        misses = sorted(
            (i for i, p in enumerate(prefixes) if p is None), key=lambda i: (keys[i], requests[i].prompt_ids)
        )
        # neighbours in sorted order share the longest prefixes: encode each run's common prefix once
        clusters: list[list[int]] = []
        for i in misses:
            if clusters and keys[clusters[-1][0]] == keys[i]:
                members = clusters[-1] + [i]
                if _common_prefix_length([requests[j].prompt_ids for j in members]) >= self.min_shared_prefix:
                    clusters[-1] = members
                    continue
            clusters.append([i])
        for members in clusters:
            prompts = [requests[j].prompt_ids for j in members]
            n = _common_prefix_length(prompts) if len(members) > 1 else len(prompts[0]) - 1
            if n < self.min_shared_prefix:
                continue
            layers = encode_prefix(model, prompts[0][:n], adapters[members[0]], cache_kw, device)
            self.stats.prefill_tokens += n
            self.prefix_cache.store(keys[members[0]], prompts[0][:n], layers)
            for j in members:
                prefixes[j] = layers
        return prefixes

    def _admit(self, model, items: list[tuple[GenerationRequest, Future]]) -> None:
        """Prefill the new requests and merge their rows into the running batch."""
        tokenizer = self.backend.tokenizer
        device = next(model.parameters()).device
        try:
            requests = self.backend.route_identity_adapters([r for r, _ in items])
            adapters = [r.adapter or BASE_ADAPTER for r in requests]
            cache_kw = _cache_kwarg(model)
            prefixes = self._prefixes(model, requests, adapters, cache_kw, device)
            cache, attention, next_pos, logits = prefill(
                model, tokenizer, requests, adapters, prefixes, cache_kw, device
            )
        except Exception as exc:  # noqa: BLE001 - the failure goes to its caller; the running batch goes on
            if len(items) > 1:  # find the request that fails: the others must not fail with it
                logger.warning("prefill of %d requests failed (%s); admitting them one by one", len(items), exc)
                for item in items:
                    self._admit(model, [item])
                return
            logger.exception("prefill of a request failed")
            items[0][1].set_exception(exc)
            return
        self.stats.prefill_tokens += sum(
            len(r.prompt_ids) - (0 if p is None else p[0][0].shape[2]) for r, p in zip(requests, prefixes, strict=True)
        )
        ids = []
        for request, fut in items:
            job_id = self._next_job
            self._next_job += 1
            self._jobs[job_id] = _Job(request, fut)
            ids.append(job_id)
        rows = make_rows(requests, adapters, ids)
        for row in rows:
            self._jobs[row.request_index].rows.append(row)
        self.stats.admissions += 1
        self.stats.requests += len(items)
        self.stats.rows += len(rows)
        if not self._rows:
            self._cache, self._attention, self._next_pos, self._logits = cache, attention, next_pos, logits
            self._rows, self._live = rows, [True] * len(rows)
            return
        if self.in_place_merge:
            try:
                merged = self._merge_in_place(cache, attention, next_pos, logits, rows)
            except Exception:  # noqa: BLE001 - it wrote only free slots: the copy still works
                logger.exception("in-place merge of %d rows failed; merging by copy", len(rows))
                merged = False
            if merged:
                self.stats.in_place_merges += 1
                return
        # one copy: the running batch's live rows (finished ones leave now) and the newcomers, right-aligned
        self.stats.copied_merges += 1
        keep = [b for b, live in enumerate(self._live) if live]
        old_attention, start = self._kept_attention(keep)
        width = max(old_attention.shape[1], attention.shape[1])
        self._cache = assemble_cache(
            [(cache_layers(self._cache), keep, start), (cache_layers(cache), None, 0)], row_capacity=self.max_batch_rows
        )
        self._attention = torch.cat([pad_left(old_attention, width, 1), pad_left(attention, width, 1)])
        idx = torch.tensor(keep, device=next_pos.device)
        self._next_pos = torch.cat([self._next_pos.index_select(0, idx), next_pos])
        self._logits = torch.cat([self._logits.index_select(0, idx), logits])
        self._rows = [self._rows[b] for b in keep] + rows
        self._live = [True] * len(self._rows)

    def _merge_in_place(self, cache, attention, next_pos, logits, rows: list[_Row]) -> bool:
        """Write the newcomers' rows into the running batch's own buffers, into the slots of finished rows first and
        then into spare rows, copying only the newcomers' keys and values (a merge by copy moves every running row's
        whole cache, which at 32 rows of 2k-token prompts costs as much as a decode step).

        Returns False, changing nothing, when it cannot: the newcomers are wider than the running batch, there are
        not enough free slots, or a quarter of the batch's leading columns is attended by nobody (then the merge by
        copy, which drops them, is due).
        """
        width, new_width = self._attention.shape[1], attention.shape[1]
        layers = self._cache.layers
        if new_width > width or not all(hasattr(layer, "row_capacity") for layer in layers):
            return False
        dead = [b for b, is_live in enumerate(self._live) if not is_live]
        spare = min(layer.row_capacity for layer in layers) - len(self._rows)
        if len(rows) > len(dead) + max(spare, 0):
            return False
        _, first = self._kept_attention([b for b, is_live in enumerate(self._live) if is_live])
        if 4 * min(first, width - new_width) >= width:
            return False
        slots = dead[: len(rows)]
        slots += range(len(self._rows), len(self._rows) + len(rows) - len(slots))
        total = max(len(self._rows), slots[-1] + 1)
        idx = torch.tensor(slots, device=self._attention.device)
        c0 = width - new_width
        for layer, (k, v) in zip(layers, cache_layers(cache), strict=True):
            buf_k, buf_v = layer._buf_k, layer._buf_v
            if c0:  # spare rows are uninitialised memory: nothing masked may hold a NaN
                buf_k[idx, :, :c0] = 0
                buf_v[idx, :, :c0] = 0
            buf_k[idx, :, c0:width] = k
            buf_v[idx, :, c0:width] = v
            layer.adopt(buf_k, buf_v, width, rows=total)
        grow = total - len(self._rows)
        if grow:
            self._attention = torch.cat([self._attention, self._attention.new_zeros((grow, width))])
            self._next_pos = torch.cat([self._next_pos, self._next_pos.new_zeros(grow)])
            self._logits = torch.cat([self._logits, self._logits.new_zeros((grow, self._logits.shape[1]))])
            self._rows += [None] * grow  # type: ignore[list-item]  # filled below
            self._live += [False] * grow
        self._attention[idx] = pad_left(attention, width, 1)
        self._next_pos[idx] = next_pos
        self._logits[idx] = logits
        for slot, row in zip(slots, rows, strict=True):
            self._rows[slot] = row
            self._live[slot] = True
        return True

    # ------------------------------------------------------------------ decoding
    def _step(self, model) -> list[_Job]:
        """Sample one token for every live row, retire finished requests, and run one decode step for the rest.
        Returns the jobs whose last row finished.

        A finished row stays in the batch (fed padding, its output ignored) until newcomers are merged in or a quarter
        of the batch has finished: dropping it at once would copy every other row's KV cache each time any row ends.
        """
        tokenizer = self.backend.tokenizer
        live = [b for b, is_live in enumerate(self._live) if is_live]
        self.stats.steps += 1
        self.stats.row_steps += len(live)
        self.stats.max_rows = max(self.stats.max_rows, len(live))
        done: list[_Job] = []
        try:
            logits = self._logits if len(live) == len(self._rows) else self._logits[live]
            sampled = sample_step(tokenizer, [self._rows[b] for b in live], logits, set(self.backend.eos_token_ids))
            tokens = [pad_token_id(tokenizer)] * len(self._rows)
            for b, tok in zip(live, sampled, strict=True):
                tokens[b] = tok
            finished = [b for b in live if self._rows[b].finish_reason is not None]
            for b in finished:
                self._live[b] = False
            done = self._retire([self._rows[b] for b in finished])
            n_live = len(live) - len(finished)
            if not n_live:
                self._reset()
                return done
            if 4 * (len(self._rows) - n_live) >= len(self._rows):
                keep = [b for b, is_live in enumerate(self._live) if is_live]
                tokens = [tokens[b] for b in keep]
                self._select(keep)
            self._cache, self._attention, self._next_pos, self._logits = decode_step(
                model,
                self._cache,
                self._attention,
                self._next_pos,
                tokens,
                [row.adapter for row in self._rows],
                _cache_kwarg(model),
            )
        except Exception as exc:  # noqa: BLE001 - fail every running request, keep serving new ones
            logger.exception("decode step over %d rows failed", len(self._rows))
            failed = {row.request_index for row in self._rows}
            for job_id in failed:
                job = self._jobs.pop(job_id, None)
                if job is not None and not job.future.done():
                    job.future.set_exception(exc)
            self._reset()
        return done

    def _retire(self, finished: list[_Row]) -> list[_Job]:
        done = []
        for job_id in {row.request_index for row in finished}:
            job = self._jobs[job_id]
            if all(row.finish_reason is not None for row in job.rows):
                done.append(self._jobs.pop(job_id))
        return done

    def _kept_attention(self, keep: list[int]) -> tuple[torch.Tensor, int]:
        """The attention mask of rows ``keep`` without the leading columns none of them attends to, and how many
        columns that drops."""
        attention = self._attention.index_select(0, torch.tensor(keep, device=self._attention.device))
        used = attention.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        return attention[:, start:], start

    def _select(self, keep: list[int]) -> None:
        """Keep only the batch rows ``keep``, and drop cache columns no remaining row attends to (one copy)."""
        self._attention, start = self._kept_attention(keep)
        self._cache = assemble_cache([(cache_layers(self._cache), keep, start)], row_capacity=self.max_batch_rows)
        idx = torch.tensor(keep, device=self._attention.device)
        self._next_pos = self._next_pos.index_select(0, idx)
        self._logits = self._logits.index_select(0, idx)
        self._rows = [self._rows[b] for b in keep]
        self._live = [True] * len(self._rows)

    def _reset(self) -> None:
        self._rows, self._live = [], []
        self._cache = self._attention = self._next_pos = self._logits = None
