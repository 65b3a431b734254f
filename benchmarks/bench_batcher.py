"""Three costs of the continuous batcher, each against the way it was done before, in one process:

    .venv/bin/python benchmarks/bench_batcher.py                 # all three parts
    .venv/bin/python benchmarks/bench_batcher.py --parts prefix   # only the (model-free) prefix-cache count

1. ``prefix``: prompt tokens the prefix cache saves when every registered program's role prompts (ChatAdapter
   format, each role's default demos, then ``--questions`` synthetic questions) arrive interleaved, with the
   cache keyed by prompt group (a digest of the system message, rolecall's default) against keyed by adapter only
   (before: a lookup cut one role's cached header down to the ~60 tokens it shares with another role's prompt).
   Deterministic counts; no model runs.
2. ``merge``: admitting newcomers into a running batch of ``--rows`` rows x ``--context`` cached tokens, half of its
   rows finished: ``assemble_cache`` (one copy into a buffer with room to grow) against index_select + pad + cat + a
   fresh cache (three copies).
3. ``base_pass``: one decode step of ``--rows`` rows on the embedded model carrying untrained role adapters, all rows
   on the base model: LoRA layers switched off for the pass against PEFT's ``adapter_names`` hooks.
4. ``rowwise``: one decode step of ``--rows`` rows of uneven lengths (uniform from a quarter of ``--context`` to 1.8
   times it, right-aligned as the batchers keep them) on the embedded model: the row-wise decode attention
   (:mod:`rolecall.lm.attention`, each row over its own columns) against transformers' SDPA over the padded width.

Timed variants alternate (``--rounds`` each) and the medians are compared. Writes
``benchmarks/results/bench_batcher.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from _common import bench_parser, write_results

PARTS = ("prefix", "merge", "base_pass", "rowwise")


# ---------------------------------------------------------------------------------------------------------- prefix
def role_prompts(questions: Sequence[str]) -> list[tuple[str, list[dict[str, str]]]]:
    """``(program/role, messages)`` for every registered program's roles, formatted the way a role call is: the
    role's default demos, then one demo's inputs with its ``question`` field (where it has one) replaced by each of
    ``questions`` in turn. Roles without a question field contribute each distinct demo input once."""
    import dspy

    from rolecall.programs.registry import build_program, program_names

    adapter = dspy.ChatAdapter()
    prompts = []
    for name in program_names():
        program = build_program(name, None, None)
        for role, predictor in program.roles.items():
            signature, demos = predictor.signature, list(predictor.demos)
            complete = [d for d in demos if all(k in d for k in signature.input_fields)]
            if not complete:
                continue
            if "question" in signature.input_fields:
                inputs = [
                    {**{k: complete[i % len(complete)][k] for k in signature.input_fields}, "question": q}
                    for i, q in enumerate(questions)
                ]
            else:
                inputs = [{k: d[k] for k in signature.input_fields} for d in complete]
            prompts.extend((f"{name}/{role}", adapter.format(signature, demos, x)) for x in inputs)
    return prompts


def prefix_savings(requests: Sequence[tuple[Any, list[int]]], *, min_shared: int = 32) -> dict[str, float]:
    """Replay ``(group, prompt_ids)`` through a :class:`PrefixCache` the way the batcher does (look up; on a miss,
    keep the prompt) with tiny stand-in KV tensors, and count the prompt tokens it saves."""
    from rolecall.lm.continuous import PrefixCache

    cache = PrefixCache(max_bytes=1 << 40, min_shared=min_shared, max_entries=128)
    total = 0
    for group, ids in requests:
        total += len(ids)
        if cache.lookup(("__base__", 0, group), ids) is None:
            n = len(ids) - 1
            cache.store(("__base__", 0, group), ids[:n], [(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1))])
    return {"prompt_tokens": total, "reused_tokens": cache.reused_tokens, "hits": cache.hits, "misses": cache.misses}


def bench_prefix(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm.embedded import embedded_lm_path
    from rolecall.lm.local import prompt_group

    tokenizer = AutoTokenizer.from_pretrained(embedded_lm_path())
    questions = [ex.question for ex in synthetic_world(seed=0).test[: args.questions]]
    prompts = role_prompts(questions)
    encoded = [
        (
            role,
            messages,
            list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)),
        )
        for role, messages in prompts
    ]
    # interleave the roles (first prompt of every role, then every second prompt, ...) the way concurrent programs do
    by_role: dict[str, list[tuple[list[dict[str, str]], list[int]]]] = {}
    for role, messages, ids in encoded:
        by_role.setdefault(role, []).append((messages, ids))
    stream = [
        item
        for rnd in range(max(map(len, by_role.values())))
        for v in by_role.values()
        if rnd < len(v)
        for item in [v[rnd]]
    ]
    grouped = prefix_savings([(prompt_group(m), ids) for m, ids in stream])
    ungrouped = prefix_savings([(None, ids) for _, ids in stream])
    result = {"roles": len(by_role), "prompts": len(stream), "grouped": grouped, "ungrouped": ungrouped}
    for name in ("grouped", "ungrouped"):
        result[name]["reused_fraction"] = result[name]["reused_tokens"] / max(result[name]["prompt_tokens"], 1)
    result["prefill_ratio"] = (ungrouped["prompt_tokens"] - ungrouped["reused_tokens"]) / max(
        grouped["prompt_tokens"] - grouped["reused_tokens"], 1
    )
    return result


# ---------------------------------------------------------------------------------------------------------- merge
def three_copy_merge(old: Sequence[tuple[torch.Tensor, torch.Tensor]], keep: torch.Tensor, new: Sequence[Any]) -> Any:
    """The merge as it was: select the kept rows, left-pad both sides, concatenate, then copy into a fresh cache."""
    from rolecall.lm.generation import new_cache, pad_left

    width = max(old[0][0].shape[2], new[0][0].shape[2])
    layers = []
    for (ko, vo), (kn, vn) in zip(old, new, strict=True):
        ko, vo = ko.index_select(0, keep), vo.index_select(0, keep)
        layers.append(
            (
                torch.cat([pad_left(ko, width, 2), pad_left(kn, width, 2)]),
                torch.cat([pad_left(vo, width, 2), pad_left(vn, width, 2)]),
            )
        )
    cache = new_cache()
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def bench_merge(args: argparse.Namespace) -> dict[str, Any]:
    from rolecall.lm.generation import assemble_cache, cache_layers

    layers, heads, head_dim = 30, 3, 64  # SmolLM2-135M's KV shape
    g = torch.Generator().manual_seed(0)

    def kv(rows: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            tuple(torch.randn(rows, heads, length, head_dim, generator=g).to(torch.bfloat16) for _ in range(2))
            for _ in range(layers)
        ]

    old, new = kv(args.rows, args.context), kv(4, args.context // 2)
    keep = list(range(0, args.rows, 2))
    keep_t = torch.tensor(keep)
    times: dict[str, list[float]] = {"three_copies": [], "assemble": []}
    with torch.inference_mode():
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            a = three_copy_merge(old, keep_t, new)
            times["three_copies"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = assemble_cache([(old, keep, 0), (new, None, 0)])
            times["assemble"].append(time.perf_counter() - t0)
    same = all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
        for x, y in zip(cache_layers(a), cache_layers(b), strict=True)
    )
    result = {k: {"ms": 1000 * statistics.median(v), "rounds_ms": [1000 * x for x in v]} for k, v in times.items()}
    result["ratio"] = result["three_copies"]["ms"] / result["assemble"]["ms"]
    result["identical"] = same
    return result


# ---------------------------------------------------------------------------------------------------------- base pass
@contextlib.contextmanager
def peft_hooks(model: Any, adapters: Sequence[str]) -> Iterator[dict]:
    """The forward kwargs as they were: PEFT's ``adapter_names`` for every batch, base rows included."""
    yield {"adapter_names": list(adapters)} if hasattr(model, "peft_config") else {}


def step(model: Any, cache: Any, attention: torch.Tensor, pos: torch.Tensor, adapters: list[str], cache_kw: str):
    """One decode step over the prefilled cache, which is then cut back to its prefill length (so every timed step
    sees the same context)."""
    from rolecall.lm.generation import decode_step

    length = attention.shape[1]
    _, _, _, logits = decode_step(model, cache, attention, pos, [5] * len(adapters), adapters, cache_kw)
    for layer in cache.layers:
        layer.keys = layer._view_k = layer._buf_k[:, :, :length]
        layer.values = layer._buf_v[:, :, :length]
    return logits


def time_decode_steps(
    lm: Any, prompts: Sequence[list[int]], variants: Sequence[tuple[str, Callable[[], None]]], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Prefill ``prompts`` once on the base model, then time ``args.steps`` decode steps under each variant (a function
    that switches the model to it), the variants alternating ``args.rounds`` times. Returns each variant's median and
    per-round milliseconds per step, and its last step's logits."""
    from rolecall.lm import generation as gen

    model, tokenizer = lm.backend.model, lm.backend.tokenizer
    adapters = [gen.BASE_ADAPTER] * len(prompts)
    cache_kw = gen._cache_kwarg(model)
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    logits: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        requests = [gen.GenerationRequest(list(p)) for p in prompts]
        cache, attention, pos, _ = gen.prefill(
            model, tokenizer, requests, adapters, [None] * len(prompts), cache_kw, "cpu"
        )
        for _ in range(args.rounds):
            for name, switch in variants:
                switch()
                step(model, cache, attention, pos, adapters, cache_kw)  # warm-up
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    out = step(model, cache, attention, pos, adapters, cache_kw)
                times[name].append((time.perf_counter() - t0) / args.steps)
                logits[name] = out
    result = {
        k: {"ms_per_step": 1000 * statistics.median(v), "rounds_ms": [1000 * x for x in v]} for k, v in times.items()
    }
    return result, logits


def bench_base_pass(args: argparse.Namespace) -> dict[str, Any]:
    from rolecall.lm import LocalLM
    from rolecall.lm import generation as gen

    lm = LocalLM(batching="static")
    for role in ("plan", "analysis", "rewrite", "answer"):  # untrained role adapters, as a program binds them
        lm.for_role(role)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 30000, (args.rows, args.context), generator=g).tolist()
    original = gen._adapter_pass

    def use(ctx: Callable) -> Callable[[], None]:
        return lambda: setattr(gen, "_adapter_pass", ctx)

    try:
        result, logits = time_decode_steps(
            lm, prompts, [("peft_hooks", use(peft_hooks)), ("base_pass", use(original))], args
        )
    finally:
        gen._adapter_pass = original
    result["ratio"] = result["peft_hooks"]["ms_per_step"] / result["base_pass"]["ms_per_step"]
    result["logits_agree"] = bool(torch.allclose(logits["peft_hooks"], logits["base_pass"], atol=1e-2, rtol=1e-2))
    return result


# ---------------------------------------------------------------------------------------------------------- rowwise
def bench_rowwise(args: argparse.Namespace) -> dict[str, Any]:
    from rolecall.lm import LocalLM
    from rolecall.lm.attention import use_rowwise_attention

    lm = LocalLM(batching="static")
    model = lm.backend.model
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(args.context // 4, args.context * 9 // 5 + 1, (args.rows,), generator=g).tolist()
    prompts = [torch.randint(100, 30000, (n,), generator=g).tolist() for n in lengths]
    variants = [
        ("sdpa", lambda: use_rowwise_attention(model, enabled=False)),
        ("rowwise", lambda: use_rowwise_attention(model)),
    ]
    try:
        result, logits = time_decode_steps(lm, prompts, variants, args)
    finally:
        use_rowwise_attention(model)
    result["ratio"] = result["sdpa"]["ms_per_step"] / result["rowwise"]["ms_per_step"]
    result["attended_fraction"] = sum(lengths) / (len(lengths) * max(lengths))
    # bf16 sums in another order differ in the last bits (as a row decoded alone differs from it in a batch); the
    # fp32 agreement is asserted in tests/lm/test_attention.py
    result["max_abs_logit_diff"] = float((logits["sdpa"].float() - logits["rowwise"].float()).abs().max())
    result["argmax_agree"] = float((logits["sdpa"].argmax(-1) == logits["rowwise"].argmax(-1)).float().mean())
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_batcher")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    parser.add_argument("--questions", type=int, default=8, help="questions per role for prefix (default 8)")
    parser.add_argument("--rows", type=int, default=16, help="batch rows for merge, base_pass and rowwise (default 16)")
    parser.add_argument("--context", type=int, default=1500, help="cached tokens per row (default 1500)")
    parser.add_argument("--steps", type=int, default=8, help="timed decode steps per round (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per variant (default 3)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(set(parts) - set(PARTS))}")
    results: dict[str, Any] = {}
    if "prefix" in parts:
        r = results["prefix"] = bench_prefix(args)
        print(f"prefix cache, {r['prompts']} role prompts of {r['roles']} roles, interleaved:")
        for name in ("grouped", "ungrouped"):
            print(
                f"  keyed {'with' if name == 'grouped' else 'without'} prompt group: reuses "
                f"{r[name]['reused_fraction']:.0%} of {r[name]['prompt_tokens']} prompt tokens"
            )
        print(f"  prefill tokens, ungrouped / grouped = {r['prefill_ratio']:.2f}x")
    if "merge" in parts:
        r = results["merge"] = bench_merge(args)
        print(f"merge {args.rows // 2} kept of {args.rows} rows x {args.context} tokens with 4 newcomers:")
        print(
            f"  three copies {r['three_copies']['ms']:6.0f} ms   assemble_cache {r['assemble']['ms']:6.0f} ms   "
            f"= {r['ratio']:.2f}x  (identical: {r['identical']})"
        )
    if "base_pass" in parts:
        r = results["base_pass"] = bench_base_pass(args)
        print(f"decode step, {args.rows} base rows x {args.context} tokens, 4 untrained adapters on the model:")
        print(
            f"  PEFT hooks {r['peft_hooks']['ms_per_step']:6.0f} ms   base pass {r['base_pass']['ms_per_step']:6.0f} ms"
            f"   = {r['ratio']:.2f}x  (logits agree: {r['logits_agree']})"
        )
    if "rowwise" in parts:
        r = results["rowwise"] = bench_rowwise(args)
        print(
            f"decode step, {args.rows} rows of {args.context // 4}-{args.context * 9 // 5} tokens "
            f"({r['attended_fraction']:.0%} of the padded width attended):"
        )
        print(
            f"  SDPA {r['sdpa']['ms_per_step']:6.0f} ms   row-wise {r['rowwise']['ms_per_step']:6.0f} ms"
            f"   = {r['ratio']:.2f}x  (max |logit diff| {r['max_abs_logit_diff']:.3g}, "
            f"same argmax in {r['argmax_agree']:.0%} of rows)"
        )
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
