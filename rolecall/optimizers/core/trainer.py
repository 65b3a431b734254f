"""Training one LoRA adapter (or adapter group) on the shared base model with a loss chosen by name.

An :class:`AdapterTrainer` owns the AdamW state of one adapter's LoRA parameters; the base weights and every other
adapter stay frozen. ``step(samples)`` splits the samples into optimizer steps of
``micro_batch_size * gradient_accumulation_steps``, accumulates the gradients of each step's micro-batches with the
loss normalized over the whole step (token-mean losses divide by the step's target tokens, as TRL's
``num_items_in_batch`` does; per-sequence losses weigh each micro-batch by its share of the samples), clips the global
gradient norm and steps. The reference policy (DPO, the GRPO KL) is the base model with adapters disabled, or
``config.ref_adapter``. The updated adapter serves generation at once: every role view shares the model object.

Sampler/trainer mismatch (GRPO, token_advantage), as TRL and verl handle it. pi_old in the clipped ratio is always the
trainer's own forward: the current one, detached (one update per batch: the ratio is exactly 1), or for a batch
trained on several times the ``old_logps`` that :meth:`AdapterTrainer.policy_logps` computed before its first update.
The sampling engine's log-probs (``TrainingSample.sampler_logps``; vLLM or the KV-cache decoder, whose numerics differ
from the training forward) never enter the ratio: they weigh each token's advantage by the truncated importance
weight ``min(exp(log pi_old - log pi_sampler), config.tis_cap)`` (detached), and the step logs the mismatch:
``mismatch/abs_logp`` (token mean of ``|log pi_old - log pi_sampler|``), ``mismatch/ratio_min`` and
``mismatch/ratio_max`` (of ``exp(log pi_old - log pi_sampler)`` before truncation), ``mismatch/tis_clipped`` (fraction
of tokens whose weight was capped) and ``tokens/sampler`` (the tokens compared).

Data-parallel updates. Under a multi-process launch (``accelerate launch --multi_gpu --num_processes W``; see
:mod:`rolecall.optimizers.core.distributed`) every process holds the whole model and runs the same loop:

1. the trainer starts from the main process's adapter weights (broadcast once, as DDP does), and each ``step``
   trains on the main process's samples (broadcast: the processes may have sampled different rollouts);
2. each optimizer step's samples are sorted as in one process and cut into W contiguous shards; process r computes
   the losses of shard r with the normalizer of the WHOLE step (its target tokens ``step_tokens``, and the share
   ``len(micro) / len(samples)`` of a per-sequence loss), so the sum of the W shard gradients is the one-process
   gradient: ``g = sum_r g_r``;
3. the adapter's gradients are summed over the processes (all-reduce; a process with an empty shard adds zeros),
   then every process clips the same global norm and takes the same AdamW step, so weights and optimizer states stay
   identical everywhere; the metrics are summed the same way and describe the step, not the shard.

``config.samples_per_step`` stays the size of the whole step, so a process gets about ``samples_per_step / W``
samples: to keep W processes busy, raise ``gradient_accumulation_steps`` (W = 8, ``micro_batch_size=2``:
``gradient_accumulation_steps=8`` gives each process one micro-batch of 2). With one process nothing is communicated
and the step is exactly the one-process step.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core import distributed
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.grpo.logprobs import build_completion_batch
from rolecall.optimizers.core.logprobs import (
    per_token_logps,
    reference_per_token_logps,
    shared_prefix_per_token_logps,
)
from rolecall.optimizers.core.losses import get_loss
from rolecall.optimizers.core.sample import TrainingSample

__all__ = ["AdapterTrainer", "TrainerConfig"]

logger = logging.getLogger(__name__)

_BACKWARD_LOSS = "_backward_loss"
"""The key this process's summed backward loss travels under when the step's metrics are summed over processes."""
MAX_SHARED_ROWS = 16
"""Most completions of one prompt in one shared-prefix micro-batch (they add only their completion tokens)."""
_MIN_KEYS = frozenset({"ratio/min", "mismatch/ratio_min"})
"""Metrics that merge over micro-batches, processes and optimizer steps by their minimum."""
_MAX_KEYS = frozenset({"ratio/max", "mismatch/ratio_max"})
"""Metrics that merge by their maximum."""
_SAMPLER_MEANS = ("mismatch/abs_logp", "mismatch/tis_clipped")
"""Token means over the tokens with sampler log-probs: weighted by ``tokens/sampler`` when merged into a step."""


class AdapterTrainer:
    """Updates one LoRA adapter of a shared :class:`~rolecall.lm.backend.ModelBackend` with AdamW.

    Args:
        lm_view_or_backend: A ``LocalLM`` (any view) or its ``ModelBackend``.
        adapter: The adapter to train (created, as the identity, if missing); several roles may share it.
        config: Optimizer, batching, clipping and loss settings.

    Raises:
        ConfigError: If the adapter has no LoRA parameters, or several processes share one GPU.
    """

    def __init__(self, lm_view_or_backend: Any, adapter: str, config: TrainerConfig) -> None:
        self.backend = getattr(lm_view_or_backend, "backend", lm_view_or_backend)
        if not hasattr(self.backend, "ensure_adapter"):
            kind = type(lm_view_or_backend).__name__
            raise TypeError(f"AdapterTrainer needs a LocalLM or a ModelBackend; got {kind}.")
        self.backend.ensure_adapter(adapter)
        self.adapter = adapter
        self.config = config
        self.loss_fn = get_loss(config.loss)
        self.params = [p for n, p in self.backend.model.named_parameters() if f".{adapter}." in n and "lora_" in n]
        if not self.params:
            raise ConfigError(f"No LoRA parameters found for adapter {adapter!r}; adapters: {self.backend.adapters}.")
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=config.learning_rate,
            betas=config.adam_betas,
            eps=config.adam_epsilon,
            weight_decay=config.weight_decay,
        )
        self.steps = 0
        self.world_size = distributed.setup()
        if self.world_size > 1:
            self._check_device()
            distributed.broadcast_parameters(self.params)  # every process starts from the main process's adapter

    def set_progress(self, progress: float) -> float:
        """Sets the learning rate for ``progress`` in [0, 1] through the stage (``config.lr_schedule``); returns it.

        Example:
            >>> trainer.set_progress(0.25)  # lr_schedule="linear", learning_rate=2e-3   # doctest: +SKIP
            0.0015
        """
        progress = min(1.0, max(0.0, float(progress)))
        scale = 1.0 - progress if self.config.lr_schedule == "linear" else 1.0
        if self.config.lr_warmup_steps:  # linear warm-up over the trainer's first optimizer steps
            scale *= min(1.0, (self.steps + 1) / (self.config.lr_warmup_steps + 1))
        lr = self.config.learning_rate * scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    @property
    def _shares_prefix(self) -> bool:
        return self.config.share_prompt_prefix and self.config.loss in ("grpo", "token_advantage")

    @property
    def token_normalized(self) -> bool:
        """Whether the loss divides by the optimizer step's target tokens (else it is a mean over its samples)."""
        cfg = self.config
        return cfg.loss in ("nll", "token_advantage") or (cfg.loss == "grpo" and cfg.loss_type == "dapo")

    # ------------------------------------------------------------------ training
    def step(self, samples: Sequence[TrainingSample]) -> dict[str, float]:
        """Trains on ``samples``: one optimizer step per ``config.samples_per_step`` of them, in order.

        Args:
            samples: Samples of this trainer's adapter; those with an empty completion are skipped.

        Returns:
            Flat metrics averaged over the optimizer steps: the loss's own (``loss/nll``, ``loss/dpo``,
            ``rewards/margins``, ``clip/frac``, ...), ``loss/total``, ``grad/norm`` (before clipping), ``grad/clipped``
            (fraction of steps clipped), ``lr``; the sampler/trainer mismatch when some sample has ``sampler_logps``
            (``mismatch/abs_logp``, ``mismatch/tis_clipped``; ``mismatch/ratio_min`` / ``mismatch/ratio_max`` and
            ``ratio/min`` / ``ratio/max`` are the minimum / maximum over every step); summed: ``tokens/loss`` (target
            tokens), ``tokens/total`` (real prompt + completion tokens), ``tokens/sampler`` (tokens with sampler
            log-probs), ``train/samples``, ``train/optimizer_steps``, ``train/skipped_steps``.

        Under several processes every process must call it (as often, in the same order); the main process's
        ``samples`` are the step's on all of them.

        Raises:
            ValueError: If a sample belongs to another adapter or lacks what the loss needs.
        """
        if self.world_size > 1:
            samples = distributed.broadcast_object(list(samples))
        samples = [s for s in samples if s.completion_ids]
        for s in samples:
            self._check(s)
        if not samples:
            return {"train/samples": 0.0, "train/optimizer_steps": 0.0}
        size = self.config.samples_per_step
        chunks = [samples[i : i + size] for i in range(0, len(samples), size)]
        results = self.backend.run_on_model_thread(lambda: self._train(chunks))  # one thread: one CPU thread pool
        self.backend.mark_updated(self.adapter)
        return _merge(results)

    def _train(self, chunks: list[list[TrainingSample]]) -> list[dict[str, float]]:
        model = self.backend.model
        with self.backend.lock:
            model.set_adapter(self.adapter)  # PEFT also freezes the other adapters' weights
            for p in self.params:
                p.requires_grad_(True)
            model.train()
            try:
                return [self._optimizer_step(model, chunk) for chunk in chunks]
            finally:
                model.eval()

    def policy_logps(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """log pi_theta of every completion token under the adapter as it is now: pi_old for a batch trained on more
        than once (store them as each sample's ``old_logps`` before the first :meth:`step`).

        The values come from the forward :meth:`step` runs (the same optimizer steps and micro-batches, shared-prompt
        encoding and ``config.temperature``), without gradient and in eval mode, on the model thread under the
        backend's lock, so the first step's ratio is exactly 1 on one process.

        Args:
            samples: Samples of this trainer's adapter, as they will be passed to :meth:`step`.

        Returns:
            One list per sample, one value per completion token (0.0 on tokens outside ``loss_mask``; an empty
            completion gets an empty list).

        Raises:
            ValueError: If a sample belongs to another adapter or lacks what the loss needs.
        """
        samples = list(samples)
        live = [s for s in samples if s.completion_ids]
        for s in live:
            self._check(s)
        size = self.config.samples_per_step
        chunks = [live[i : i + size] for i in range(0, len(live), size)]
        found = self.backend.run_on_model_thread(lambda: self._policy_logps(chunks))
        return [found[id(s)] if s.completion_ids else [] for s in samples]

    def _policy_logps(self, chunks: list[list[TrainingSample]]) -> dict[int, list[float]]:
        model = self.backend.model
        device = next(model.parameters()).device
        found: dict[int, list[float]] = {}
        with self.backend.lock, torch.no_grad():
            model.set_adapter(self.adapter)
            training = model.training
            model.eval()
            try:
                for chunk in chunks:
                    for micro in self._micro_batches(self._ordered(chunk)):
                        logps, _, _, _ = self._policy_forward(model, micro, device)
                        for i, s in enumerate(micro):
                            start = len(s.prompt_ids)
                            found[id(s)] = logps[i, start : start + len(s.completion_ids)].tolist()
            finally:
                model.train(training)
        return found

    def _ordered(self, samples: list[TrainingSample]) -> list[TrainingSample]:
        """A step's samples in micro-batch order: by prompt for the shared-prefix forward, else by length."""
        if self._shares_prefix:
            return sorted(samples, key=lambda s: (len(s.prompt_ids), s.prompt_ids, len(s.completion_ids)))
        return sorted(samples, key=lambda s: s.num_tokens)

    def _micro_batches(self, samples: list[TrainingSample]) -> list[list[TrainingSample]]:
        mb = self.config.micro_batch_size
        return _prompt_groups(samples, mb) if self._shares_prefix else _chunks(samples, mb)

    def _optimizer_step(self, model: Any, samples: list[TrainingSample]) -> dict[str, float]:
        device = next(model.parameters()).device
        step_tokens = sum(s.num_loss_tokens + (sum(s.rejected_loss_mask or ()) if self.config.loss == "dpo" else 0)
                          for s in samples)  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        extremes: dict[str, float] = {}  # the _MIN_KEYS / _MAX_KEYS, merged by min / max
        total_loss = 0.0
        # micro-batches of similar length pad less; the step's loss and gradient do not depend on the grouping.
        # RL samples are grouped by prompt first, so a group's completions share one prompt encoding (one micro-batch
        # per group, whatever micro_batch_size: see _prompt_groups)
        samples = self._ordered(samples)
        # several processes: each takes a contiguous shard, normalized over the whole step (see the module docstring)
        mine = samples if self.world_size == 1 else distributed.shard(samples, distributed.rank(), self.world_size)
        for micro in self._micro_batches(mine):
            loss, metrics = self._micro_batch_loss(model, micro, device, step_tokens)
            share = len(micro) / len(samples)
            if not self.token_normalized:
                loss = loss * share  # per-sequence means: weigh by the micro-batch's share of the step's samples
            loss.backward()
            total_loss += float(loss.detach())
            for key, value in metrics.items():
                if key in _MIN_KEYS or key in _MAX_KEYS:
                    pick = min if key in _MIN_KEYS else max
                    extremes[key] = pick(extremes[key], value) if key in extremes else value
                    continue
                # token-normalized loss terms already add up to the step's loss; diagnostics are means: weigh them
                # (the mismatch means by their tokens: micro-batches without sampler log-probs have none)
                additive = key.startswith("tokens/") or (self.token_normalized and key.startswith("loss/"))
                weight = metrics["tokens/sampler"] if key in _SAMPLER_MEANS else 1.0 if additive else share
                sums[key] = sums.get(key, 0.0) + value * weight
        if self.world_size > 1:  # g = sum_r g_r; the step's metrics are the sums of the shards' weighted sums too
            distributed.all_reduce_gradients(self.params)
            sums = distributed.sum_over_processes({**sums, _BACKWARD_LOSS: total_loss})
            total_loss = sums.pop(_BACKWARD_LOSS)
            extremes = _extremes_over_processes(extremes)
        sums.update(extremes)
        for key in _SAMPLER_MEANS:
            if key in sums:
                sums[key] /= max(sums.get("tokens/sampler", 0.0), 1.0)
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        skipped = not math.isfinite(grad_norm)
        if skipped:  # a non-finite gradient would poison the adapter: skip this step, keep the run going
            logger.warning("non-finite gradient norm for adapter %r; optimizer step skipped", self.adapter)
        else:
            self.optimizer.step()
            self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        sums.pop("tokens/count", None)
        sums.update({
            "loss/total": total_loss,
            "grad/norm": grad_norm,
            "grad/clipped": float(grad_norm > max_norm),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "tokens/loss": float(step_tokens),
            "tokens/total": float(sum(s.num_tokens for s in samples)),
            "train/samples": float(len(samples)),
            "train/optimizer_steps": 0.0 if skipped else 1.0,
            "train/skipped_steps": 1.0 if skipped else 0.0,
        })  # fmt: skip
        return sums

    def _micro_batch_loss(
        self, model: Any, micro: list[TrainingSample], device: torch.device, step_tokens: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        if cfg.loss == "dpo":
            return self._dpo_loss(model, micro, device)
        logps, ids, attention, mask = self._policy_forward(model, micro, device)  # (B, T)
        weights = torch.tensor([s.weight for s in micro], dtype=logps.dtype, device=device)  # (B,)
        if cfg.loss == "nll":
            return self.loss_fn(logps, mask, weights=weights, num_tokens=step_tokens)
        old = _aligned(micro, [s.old_logps for s in micro], logps.detach(), mask)  # (B, T), pi_old: the trainer's own
        advantages = _aligned(micro, [s.per_token_advantages() for s in micro], torch.zeros_like(logps), mask)
        advantages = advantages * weights[:, None]  # w * min(rA, clip(r)A) = min(r wA, clip(r) wA) for w >= 0
        tis, mismatch = _importance_weights(micro, old, mask, cfg.tis_cap)
        if tis is not None:
            advantages = advantages * tis  # the same identity: the TIS weight is >= 0 and detached
        if cfg.loss == "token_advantage":
            loss, metrics = self.loss_fn(logps, old, advantages, mask, cfg.epsilon, epsilon_high=cfg.clip_high,
                                         num_tokens=step_tokens)  # fmt: skip
            return loss, {**metrics, **mismatch}
        ref = None
        if cfg.kl_beta > 0:
            ref = self._reference(model, micro, [s.ref_logps for s in micro], ids, attention, mask)
        loss, metrics = self.loss_fn(
            logps, old, advantages, mask, ref_per_token_logps=ref, beta=cfg.kl_beta, epsilon_low=cfg.epsilon,
            epsilon_high=cfg.clip_high, loss_type=cfg.loss_type, max_completion_length=cfg.max_completion_length,
            num_tokens=step_tokens if cfg.loss_type == "dapo" else None,
        )  # fmt: skip
        return loss, {**metrics, **mismatch}

    def _policy_forward(
        self, model: Any, micro: list[TrainingSample], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi_theta of the micro-batch's completion tokens, (B, T), with the batch's ids, attention and mask."""
        batch = _batch(self.backend.tokenizer, micro, [s.completion_ids for s in micro], [s.loss_mask for s in micro],
                       device)  # fmt: skip
        ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
        prompt, temperature = micro[0].prompt_ids, self.config.temperature
        if self._shares_prefix and len(micro) > 1 and len(prompt) >= 2 and all(s.prompt_ids == prompt for s in micro):
            logps = shared_prefix_per_token_logps(model, ids, attention, mask, len(prompt), temperature=temperature)
        else:
            logps = per_token_logps(model, ids, attention, mask, temperature=temperature)
        return logps, ids, attention, mask

    def _dpo_loss(
        self, model: Any, micro: list[TrainingSample], device: torch.device
    ) -> tuple[torch.Tensor, dict[str, float]]:
        # chosen rows then rejected rows, one forward pass (TRL concatenates the same way)
        rows = [*micro, *micro]
        completions = [s.completion_ids for s in micro] + [s.rejected_ids for s in micro]
        masks = [s.loss_mask for s in micro] + [s.rejected_loss_mask for s in micro]
        batch = _batch(self.backend.tokenizer, rows, completions, masks, device)
        ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
        logps = per_token_logps(model, ids, attention, mask, temperature=self.config.temperature).sum(-1)  # (2B,)
        recorded = [s.ref_logps for s in micro] + [s.rejected_ref_logps for s in micro]
        ref = self._reference(model, rows, recorded, ids, attention, mask, completions=completions).sum(-1)  # (2B,)
        if self.config.dpo_length_normalize:  # mean over each completion's loss tokens
            length = mask.sum(-1).to(logps.dtype).clamp(min=1)
            logps, ref = logps / length, ref / length
        n = len(micro)
        weights = torch.tensor([s.weight for s in micro], dtype=logps.dtype, device=device)
        return self.loss_fn(logps[:n], logps[n:], ref[:n], ref[n:], self.config.beta, weights=weights)

    def _reference(
        self,
        model: Any,
        rows: list[TrainingSample],
        recorded: list[list[float] | None],
        ids: torch.Tensor,
        attention: torch.Tensor,
        mask: torch.Tensor,
        completions: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """log pi_ref per token: the recorded values when every row has them, else one reference forward pass."""
        if all(r is not None for r in recorded):
            return _aligned(rows, recorded, torch.zeros(ids.shape, device=ids.device), mask, completions=completions)
        return reference_per_token_logps(model, ids, attention, mask, adapter=self.config.ref_adapter,
                                         temperature=self.config.temperature)  # fmt: skip

    def _check_device(self) -> None:
        device = next(self.backend.model.parameters()).device
        if device.type == "cuda" and device.index not in (None, torch.cuda.current_device()):
            raise ConfigError(
                f"Process {distributed.rank()} holds its model on {device}, not on its own GPU "
                f"cuda:{torch.cuda.current_device()}; call rolecall.optimizers.core.distributed.setup() before "
                "loading the model (LocalLM) so that each process loads it onto its own GPU."
            )

    def _check(self, sample: TrainingSample) -> None:
        if sample.adapter != self.adapter:
            raise ValueError(f"Sample of role {sample.role!r} trains adapter {sample.adapter!r}, not {self.adapter!r}.")
        loss = self.config.loss
        if loss == "dpo" and not sample.rejected_ids:
            raise ValueError(f"loss='dpo' needs rejected_ids on every sample; role {sample.role!r} has none.")
        if loss in ("grpo", "token_advantage") and sample.advantage is None and sample.token_advantages is None:
            raise ValueError(f"loss={loss!r} needs advantage or token_advantages; role {sample.role!r} has neither.")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The optimizer state, the step count and the adapter name (the weights are saved as a PEFT adapter)."""
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps, "adapter": self.adapter}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned.

        Raises:
            ConfigError: If the state belongs to another adapter.
        """
        if state.get("adapter", self.adapter) != self.adapter:
            raise ConfigError(f"Optimizer state of adapter {state['adapter']!r} cannot load into {self.adapter!r}.")
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])


def _chunks(samples: list[TrainingSample], size: int) -> list[list[TrainingSample]]:
    return [samples[i : i + size] for i in range(0, len(samples), size)]


def _prompt_groups(samples: list[TrainingSample], size: int) -> list[list[TrainingSample]]:
    """Micro-batches for the shared-prefix forward: each prompt's completions (a GRPO group) together, the prompt
    encoded once for them (at most :data:`MAX_SHARED_ROWS` a batch, so ``size`` does not split a group of G > size);
    prompts seen once are packed ``size`` at a time. ``samples`` are sorted by prompt."""
    groups: list[list[TrainingSample]] = []
    single: list[TrainingSample] = []
    for _, same_prompt in itertools.groupby(samples, key=lambda s: s.prompt_ids):
        run = list(same_prompt)
        if len(run) == 1:
            single.extend(run)
        else:
            groups.extend(_chunks(run, max(size, MAX_SHARED_ROWS)))
    return groups + _chunks(single, size)


def _batch(
    tokenizer: Any,
    rows: list[TrainingSample],
    completions: list[list[int]],
    masks: list[list[int] | None],
    device: torch.device,
) -> dict[str, torch.Tensor]:
    return build_completion_batch(tokenizer, [s.prompt_ids for s in rows], completions, loss_masks=masks, device=device)


def _aligned(
    rows: list[TrainingSample],
    values: list[list[float] | None],
    default: torch.Tensor,
    mask: torch.Tensor,
    *,
    completions: list[list[int]] | None = None,
) -> torch.Tensor:
    """Per-completion-token lists placed at their (B, T) positions (after each prompt); ``default`` elsewhere."""
    out = default.clone()
    for i, (sample, row) in enumerate(zip(rows, values, strict=True)):
        if row is None:
            continue
        start = len(sample.prompt_ids)
        n = len(completions[i]) if completions is not None else len(sample.completion_ids)
        out[i, start : start + n] = torch.tensor(row[:n], dtype=out.dtype, device=out.device)
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def _importance_weights(
    rows: list[TrainingSample], old: torch.Tensor, mask: torch.Tensor, cap: float | None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The truncated importance weights ``min(exp(old - sampler), cap)`` per token, (B, T) and detached (1 where a
    sample has no ``sampler_logps``, and everywhere when ``cap`` is None: then None), and the mismatch metrics.

    Worked example: old = [-1.0, -2.0], sampler = [-1.5, -1.0], cap 2: ratios exp([0.5, -1]) = [1.6487, 0.3679],
    weights [1.6487, 0.3679]; ``mismatch/abs_logp`` 0.75, ``mismatch/ratio_max`` 1.6487, ``mismatch/tis_clipped`` 0.
    """
    recorded = [s.sampler_logps for s in rows]
    if all(r is None for r in recorded):
        return None, {}
    has = torch.tensor([r is not None for r in recorded], device=mask.device)[:, None] & mask.bool()  # (B, T)
    old = old.detach()
    sampler = _aligned(rows, recorded, old, mask)  # rows without sampler log-probs: old, so ratio 1
    log_ratio = torch.where(has, old - sampler, torch.zeros_like(old))
    ratio = torch.exp(log_ratio)
    weights = None if cap is None else torch.where(has, ratio.clamp(max=cap), torch.ones_like(ratio))
    count = int(has.sum())
    if count == 0:  # every such token is outside the loss mask
        return weights, {}
    clipped = (ratio[has] > cap).sum() if cap is not None else 0
    metrics = {
        "mismatch/abs_logp": float(log_ratio[has].abs().sum() / count),
        "mismatch/ratio_min": float(ratio[has].min()),
        "mismatch/ratio_max": float(ratio[has].max()),
        "mismatch/tis_clipped": float(clipped) / count,
        "tokens/sampler": float(count),
    }
    return weights, metrics


def _extremes_over_processes(extremes: dict[str, float]) -> dict[str, float]:
    """The minimum of each of the _MIN_KEYS and the maximum of each of the _MAX_KEYS over the processes (a process
    without a key, e.g. with an empty shard, does not count)."""
    gathered: list[Any] = [None] * distributed.world_size()
    torch.distributed.all_gather_object(gathered, dict(extremes))
    merged: dict[str, float] = {}
    for part in gathered:
        for key, value in part.items():
            pick = min if key in _MIN_KEYS else max
            merged[key] = pick(merged[key], value) if key in merged else value
    return merged


def _merge(results: list[dict[str, float]]) -> dict[str, float]:
    """Sums the counters over optimizer steps, takes the minimum / maximum of the _MIN_KEYS / _MAX_KEYS and averages
    the rest (over the steps that report it: a step without sampler log-probs has no mismatch metrics)."""
    summed = ("tokens/", "train/")
    keys = dict.fromkeys(key for r in results for key in r)
    merged: dict[str, float] = {}
    for key in keys:
        values = [r[key] for r in results if key in r]
        if key.startswith(summed):
            merged[key] = sum(values)
        elif key in _MIN_KEYS or key in _MAX_KEYS:
            merged[key] = min(values) if key in _MIN_KEYS else max(values)
        else:
            merged[key] = sum(values) / len(values)
    return merged
