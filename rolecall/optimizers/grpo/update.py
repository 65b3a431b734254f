"""One GRPO policy update of one role's LoRA adapter, from scored groups of completions.

The trainer owns the adapter's AdamW state. A step takes :class:`PolicySample` s (prompt ids, completion ids, the
log-probs recorded at sampling time and the group advantage), recomputes the policy's per-token log-probs with the
role's adapter active, the reference log-probs with every adapter disabled (pi_ref = the initial model, OPERA Eq. 4),
and minimises :func:`~rolecall.optimizers.grpo.loss.grpo_loss` with gradient accumulation over micro-batches. The
base weights and the other roles' adapters are frozen; the updated adapter serves generation immediately (the same
model object backs every role view).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.grpo.config import GRPOConfig
from rolecall.optimizers.grpo.logprobs import build_completion_batch, ref_logprobs, sequence_logprobs
from rolecall.optimizers.grpo.loss import grpo_loss

__all__ = ["PolicySample", "RoleTrainer"]

logger = logging.getLogger(__name__)


@dataclass
class PolicySample:
    """One completion that receives gradient.

    Attributes:
        prompt_ids: the tokenized prompt (chat template applied), exactly as sampled.
        completion_ids: the sampled completion tokens (EOS included when generation stopped on it).
        advantage: the completion's group advantage A_i.
        old_logps: per-token log-probs recorded at sampling time (pi_old); None recomputes them (on-policy).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    old_logps: list[float] | None = None


def _adapter_parameters(model: Any, adapter: str) -> list[torch.nn.Parameter]:
    params = [p for n, p in model.named_parameters() if f".{adapter}." in n and "lora_" in n]
    if not params:
        raise ConfigError(f"No LoRA parameters found for adapter {adapter!r}; create it with lm.for_role({adapter!r})")
    return params


class RoleTrainer:
    """GRPO updates of one role's LoRA adapter on a shared :class:`~rolecall.lm.backend.ModelBackend`.

    Args:
        lm: the role's LocalLM view (``local_lm.for_role(role)``).
        config: loss, clipping, KL and optimizer settings.
        micro_batch_size: completions per forward/backward pass (gradients accumulate over a step's samples).
    """

    def __init__(self, lm: Any, config: GRPOConfig, *, micro_batch_size: int = 2) -> None:
        if getattr(lm, "adapter", None) is None:
            raise ConfigError("RoleTrainer needs a role view with a LoRA adapter: pass local_lm.for_role(name)")
        self.lm = lm
        self.role: str = lm.adapter
        self.backend = lm.backend
        self.config = config
        self.micro_batch_size = micro_batch_size
        self.params = _adapter_parameters(self.backend.model, self.role)
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate, weight_decay=0.0)
        self.steps = 0

    def step(self, samples: Sequence[PolicySample]) -> dict[str, float]:
        """One optimizer step on ``samples``; returns flat namespaced metrics (``loss/policy``, ``kl/mean``, ...)."""
        samples = [s for s in samples if s.completion_ids]
        if not samples:
            return {"train/skipped": 1.0}
        model = self.backend.model
        device = next(model.parameters()).device
        total_tokens = sum(len(s.completion_ids) for s in samples)
        sums: dict[str, float] = {}
        with self.backend.lock:
            model.set_adapter(self.role)  # also makes only this adapter trainable
            for p in self.params:
                p.requires_grad_(True)
            model.train()
            try:
                self.optimizer.zero_grad(set_to_none=True)
                for start in range(0, len(samples), self.micro_batch_size):
                    chunk = samples[start : start + self.micro_batch_size]
                    loss, metrics = self._micro_batch(model, chunk, device, total_tokens)
                    (loss * len(chunk) / len(samples)).backward()
                    for key, value in metrics.items():
                        sums[key] = sums.get(key, 0.0) + value * len(chunk) / len(samples)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                else:  # a non-finite gradient would poison the adapter: skip the step, keep the run going
                    logger.warning("non-finite gradient norm in role %r; step skipped", self.role)
                self.optimizer.zero_grad(set_to_none=True)
            finally:
                model.eval()
        self.steps += 1
        self.backend.mark_updated(self.role)
        sums["grad/norm"] = float(grad_norm) if math.isfinite(float(grad_norm)) else float("nan")
        sums["train/samples"] = float(len(samples))
        sums["train/completion_tokens"] = float(total_tokens)
        return sums

    def _micro_batch(
        self, model: Any, chunk: Sequence[PolicySample], device: torch.device, total_tokens: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        batch = build_completion_batch(
            self.backend.tokenizer,
            [s.prompt_ids for s in chunk],
            [s.completion_ids for s in chunk],
            device=device,
        )
        input_ids, attention, completion_mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
        per_token_logps = sequence_logprobs(model, input_ids, attention, completion_mask)  # (B, T)
        old = per_token_logps.detach().clone()
        for i, s in enumerate(chunk):
            if s.old_logps is not None and len(s.old_logps) == len(s.completion_ids):
                start = len(s.prompt_ids)
                old[i, start : start + len(s.old_logps)] = torch.tensor(s.old_logps, device=device)
        ref = None
        if self.config.beta > 0:
            ref = ref_logprobs(model, input_ids, attention, completion_mask)
        advantages = torch.tensor([s.advantage for s in chunk], dtype=per_token_logps.dtype, device=device)
        loss, metrics = grpo_loss(
            per_token_logps,
            old,
            advantages,
            completion_mask,
            ref_per_token_logps=ref,
            beta=self.config.beta,
            epsilon_low=self.config.epsilon_low,
            epsilon_high=self.config.epsilon_high,
            loss_type=self.config.loss_type,
            max_completion_length=self.config.max_completion_length,
            num_tokens=total_tokens if self.config.loss_type == "dapo" else None,
        )
        return loss, metrics

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Optimizer state and step count (the adapter weights are saved separately in PEFT format)."""
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])

    def save(self, path: str | Path) -> None:
        """Write the adapter (PEFT format) and the optimizer state to directory ``path``."""
        path = Path(path)
        self.lm.save_adapter(path / "adapter")
        torch.save(self.state_dict(), path / "trainer.pt")

    def load(self, path: str | Path) -> None:
        """Restore adapter weights and optimizer state written by :meth:`save`."""
        path = Path(path)
        self.backend.load_adapter(self.role, path / "adapter")
        self.params = _adapter_parameters(self.backend.model, self.role)
        self.optimizer = torch.optim.AdamW(self.params, lr=self.config.learning_rate, weight_decay=0.0)
        self.load_state_dict(torch.load(path / "trainer.pt", weights_only=True))
