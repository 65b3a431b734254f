"""MAPGRPO: Multi-Agents Progressive GRPO (OPERA, Liu et al., arXiv 2508.16438, Sec. 4).

Agents train one after another (plan -> analysis -> rewrite). Stage k collects its role's inputs by running the
program with the agents < k already trained (Eq. 5-6). For each input x it samples G-1 candidates from the current
policy and adds c_best, the best pre-scored candidate (Eq. 11), which enters the group baseline but gets no gradient:

    A_i = r_i - mean_j r_j                                   (Eq. 2, j over the G-1 samples and c_best)
    L = -(1/|o|) sum_t min(ρ_t A_i, clip(ρ_t, 1-ε, 1+ε) A_i) + β KL_k3(π_θ || π_ref)    (Eq. 3-4)

π_ref is the initial model (the role's LoRA adapter disabled). Each role owns its LoRA adapter on one shared base
model, so updating the plan agent never disturbs the analysis agent. Rollouts use ``LocalLM.sample``: the G-1
samples of one prompt share a single prefill, and the groups of one step are batched together.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dspy
import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.grpo.advantages import group_advantages
from rolecall.optimizers.grpo.config import GRPOConfig
from rolecall.optimizers.grpo.update import PolicySample, RoleTrainer
from rolecall.optimizers.mapgrpo_config import MAPGRPOConfig
from rolecall.optimizers.mapgrpo_roles import OperaRoleTasks, RoleInput, as_gold_record

__all__ = ["MAPGRPO"]

logger = logging.getLogger(__name__)


class MAPGRPO(dspy.teleprompt.Teleprompter):
    """Trains each role of an OPERA program in turn with GRPO and an expert-augmented group (a ``dspy.Teleprompter``).

    Args:
        config: a :class:`MAPGRPOConfig`; keyword arguments override its fields (``MAPGRPO(group_size=4)``).

    Example:
        >>> program = OPERA(BM25(world.corpus), lm=LocalLM())                    # doctest: +SKIP
        >>> program.compile(optimizer=MAPGRPO(group_size=4), trainset=world.train)  # doctest: +SKIP
    """

    def __init__(self, config: MAPGRPOConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        if config is not None and overrides:
            config = MAPGRPOConfig(**{**vars(config), **overrides})
        self.config = config or MAPGRPOConfig(**overrides)
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ entry point
    def compile(self, student: Any, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **_: Any) -> Any:
        """Train ``student``'s role adapters in place and return it.

        Raises:
            ConfigError: when a stage's role is missing or is not bound to a LocalLM LoRA adapter view.
        """
        cfg = self.config
        records = [as_gold_record(e) for e in trainset]
        if not records:
            raise ConfigError("MAPGRPO needs a non-empty trainset")
        views = self._role_views(student)
        tasks = OperaRoleTasks(student, cfg)
        out = Path(cfg.output_dir) if cfg.output_dir is not None else None
        state = self._load_state(out) if cfg.resume else {"done": [], "stage": None, "step": 0}
        if cfg.resume and out is not None:
            self._restore_adapters(views, out, state)
        self._started = time.perf_counter()
        self._stages_run = 0
        self._stage_costs: list[float] = []
        for stage in cfg.stages:
            if stage in state["done"]:
                logger.info("MAPGRPO: stage %s already trained (resumed)", stage)
                continue
            start_step = state["step"] if state["stage"] == stage else 0
            self._train_stage(student, stage, views[stage], tasks, records, start_step, out)
            state = {"done": [*state["done"], stage], "stage": None, "step": 0}
            if out is not None:
                self._save_state(out, state)
        return student

    def _stage_deadline(self, stage: str) -> float | None:
        """When ``stage`` must stop: compile start + the budget share of this and every earlier stage."""
        cfg = self.config
        if cfg.time_budget_s is None:
            return None
        upto = cfg.stages[: cfg.stages.index(stage) + 1]
        return self._started + sum(cfg.stage_budget_s(s) or 0.0 for s in upto)

    def _role_views(self, program: Any) -> dict[str, Any]:
        roles = program.roles
        views = {}
        for stage in self.config.stages:
            if stage not in roles:
                raise ConfigError(f"MAPGRPO stage {stage!r} is not a role of this program; roles: {sorted(roles)}")
            lm = roles[stage].lm
            if lm is None or getattr(lm, "adapter", None) is None or not hasattr(lm, "sample"):
                raise ConfigError(
                    f"role {stage!r} must run on a rolecall LocalLM adapter view: build the program with "
                    "lm=LocalLM() (per_role_adapters=True) or call program.bind_role_adapters(local_lm)"
                )
            views[stage] = lm
        return views

    # ------------------------------------------------------------------ one stage
    def _train_stage(
        self, program: Any, stage: str, view: Any, tasks: OperaRoleTasks, records: list, start_step: int, out: Any
    ) -> None:
        cfg = self.config
        grpo = GRPOConfig(
            group_size=cfg.group_size,
            beta=cfg.beta[stage],
            epsilon_low=cfg.epsilon,
            epsilon_high=cfg.epsilon,
            loss_type=cfg.loss_type,
            learning_rate=cfg.learning_rate[stage],
            max_completion_length=cfg.max_completion_length,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
        )
        trainer = RoleTrainer(view, grpo, micro_batch_size=cfg.micro_batch_size)
        if start_step > 0 and out is not None and (out / "checkpoint" / stage / "trainer.pt").is_file():
            trainer.load(out / "checkpoint" / stage)
        rng = random.Random(f"{cfg.seed}-{stage}")
        t0 = time.perf_counter()
        deadline = self._stage_deadline(stage)
        # the first stage this compile runs always gets its first step, however small the budget; a later stage is
        # skipped when what is left of the budget cannot fit the cheapest earlier stage's collection + first step
        if deadline is not None and self._stages_run > 0:
            needed = min(self._stage_costs, default=0.0)
            if t0 + needed >= self._started + cfg.time_budget_s:
                logger.warning(
                    "MAPGRPO %s: %.0fs of the time budget left, a stage needs about %.0fs; stage skipped",
                    stage,
                    max(self._started + cfg.time_budget_s - t0, 0.0),
                    needed,
                )
                return
        self._stages_run += 1
        pool = tasks.collect(stage, records, rng)
        logger.info("MAPGRPO %s: %d training inputs collected in %.0fs", stage, len(pool), time.perf_counter() - t0)
        if not pool:
            logger.warning("MAPGRPO %s: the program produced no %s inputs; stage skipped", stage, stage)
            return
        bar = _progress(cfg.show_progress, total=cfg.steps[stage], initial=start_step, desc=f"MAPGRPO {stage}")
        last_step_s = 0.0
        for step in range(start_step, cfg.steps[stage]):
            # stop before a step that would overrun the stage's share of the budget (judged by the previous step)
            if deadline is not None and time.perf_counter() + last_step_s > deadline and step > start_step:
                logger.info("MAPGRPO %s: this stage's share of the time budget is spent after %d steps", stage, step)
                break
            step_rng = random.Random(f"{cfg.seed}-{stage}-{step}")
            batch = step_rng.sample(pool, min(cfg.inputs_per_step, len(pool)))
            ts = time.perf_counter()
            samples, reward_metrics = self._rollout(program, stage, view, tasks, batch, seed=cfg.seed * 7919 + step)
            metrics = trainer.step(samples)
            last_step_s = time.perf_counter() - ts
            if step == start_step:
                self._stage_costs.append(time.perf_counter() - t0)  # collection + first step
            record = {
                "stage": stage,
                "step": step + 1,
                **reward_metrics,
                **metrics,
                "time/step_s": time.perf_counter() - ts,
            }
            self._log(out, record)
            if out is not None:
                trainer.save(out / "checkpoint" / stage)
                self._save_state(out, {"done": self._done(out), "stage": stage, "step": step + 1})
            if bar is not None:
                bar.set_postfix(reward=f"{record['reward/mean']:.3f}", kl=f"{metrics.get('kl/mean', 0):.4f}")
                bar.update(1)
        if bar is not None:
            bar.close()
        if out is not None:
            view.save_adapter(out / "adapters" / stage)

    def _rollout(
        self, program: Any, stage: str, view: Any, tasks: OperaRoleTasks, batch: list[RoleInput], *, seed: int
    ) -> tuple[list[PolicySample], dict[str, float]]:
        """Sample, parse and score G-1 candidates per input, add c_best, and turn the groups into policy samples."""
        cfg = self.config
        predictor = program.roles[stage]
        role_adapter = getattr(program, "role_adapter", None)
        adapter = (role_adapter(stage) if role_adapter else None) or dspy.settings.adapter or dspy.ChatAdapter()
        messages = [adapter.format(predictor.signature, _demos(predictor), item.inputs) for item in batch]
        role_kwargs = {
            **getattr(program, "lm_kwargs", {}).get("*", {}),
            **getattr(program, "lm_kwargs", {}).get(stage, {}),
        }
        groups = view.sample(
            messages,
            n=cfg.policy_samples,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=min(cfg.max_completion_length, role_kwargs.get("max_tokens", cfg.max_completion_length)),
            stop=tuple(role_kwargs.get("stop", ())),
            seed=seed,
            logprobs=True,
        )

        experts: list[dict[str, Any] | None] = [None] * len(batch)
        parsed_counts = [0] * len(batch)

        def score(i: int) -> tuple[list[tuple[float, dict]], tuple[float, dict] | None]:
            outputs = [_parse(adapter, predictor.signature, c.text) for c in groups[i]]
            parsed_counts[i] = sum(o is not None for o in outputs)
            scored = tasks.score(stage, batch[i], outputs)
            experts[i] = self._expert(stage, batch[i], tasks, view, adapter, predictor, messages[i], seed + i)
            return scored, (tasks.score(stage, batch[i], [experts[i]])[0] if experts[i] is not None else None)

        with ThreadPoolExecutor(max(1, len(batch))) as pool:
            scored = list(pool.map(score, range(len(batch))))
        samples: list[PolicySample] = []
        rewards_all, expert_all = [], []
        components: dict[str, list[float]] = {}
        for item_msgs, comps, (cand, expert), expert_out in zip(messages, groups, scored, experts, strict=True):
            rewards = [r for r, _ in cand] + ([expert[0]] if expert is not None else [])
            advantages = group_advantages(torch.tensor([rewards]))[0]  # (G,), c_best inside the baseline
            prompt_ids = view.backend.encode_messages(item_msgs)
            for c, adv in zip(comps, advantages[: len(comps)].tolist(), strict=True):  # c_best gets no gradient
                samples.append(PolicySample(prompt_ids, c.token_ids, adv, c.logprobs))
            if cfg.expert_gradient and expert is not None and expert_out is not None:
                ids = _expert_ids(view, adapter, predictor.signature, expert_out)
                samples.append(PolicySample(prompt_ids, ids, float(advantages[-1]), None))
            rewards_all += [r for r, _ in cand]
            if expert is not None:
                expert_all.append(expert[0])
            for _, parts in cand:
                for k, v in parts.items():
                    components.setdefault(k, []).append(v)
        metrics = {
            "reward/mean": _mean(rewards_all),
            "reward/std": float(torch.tensor(rewards_all).std()) if len(rewards_all) > 1 else 0.0,
            "reward/max": max(rewards_all, default=0.0),
            "reward/expert": _mean(expert_all),
            "parse/rate": sum(parsed_counts) / max(1, len(rewards_all)),
        }
        metrics.update({f"reward/{k}": _mean(v) for k, v in components.items()})
        return samples, metrics

    def _expert(
        self,
        stage: str,
        item: RoleInput,
        tasks: OperaRoleTasks,
        view: Any,
        adapter: Any,
        predictor: Any,
        messages: list,
        seed: int,
    ) -> dict[str, Any] | None:
        cfg = self.config
        if cfg.expert == "gold":
            return tasks.gold_expert(stage, item)
        if cfg.expert == "best_of_n":
            extra = view.sample(
                messages,
                n=cfg.expert_samples,
                temperature=cfg.temperature,
                seed=seed + 10**6,
                max_tokens=cfg.max_completion_length,
            )
            outputs = [_parse(adapter, predictor.signature, c.text) for c in extra]
            scored = tasks.score(stage, item, outputs)
            best = max(range(len(outputs)), key=lambda i: scored[i][0])
            return outputs[best]
        return None

    # ------------------------------------------------------------------ logging and checkpoints
    def _log(self, out: Path | None, record: dict[str, Any]) -> None:
        self.history.append(record)
        logger.info(
            "MAPGRPO %s step %d: %s",
            record["stage"],
            record["step"],
            {k: round(v, 4) for k, v in record.items() if isinstance(v, float)},
        )
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "train_log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    @staticmethod
    def _save_state(out: Path, state: dict[str, Any]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(out / "state.json")  # atomic: a kill never leaves half a state file

    @staticmethod
    def _load_state(out: Path | None) -> dict[str, Any]:
        path = out / "state.json" if out is not None else None
        if path is None or not path.is_file():
            return {"done": [], "stage": None, "step": 0}
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is corrupt ({exc}); delete it to restart training from scratch") from exc

    def _done(self, out: Path) -> list[str]:
        return self._load_state(out).get("done", [])

    def _restore_adapters(self, views: dict[str, Any], out: Path, state: dict[str, Any]) -> None:
        for stage in state["done"]:
            path = out / "adapters" / stage
            if (path / "adapter_config.json").is_file():
                views[stage].backend.load_adapter(stage, path)
        stage = state.get("stage")
        if stage and (out / "checkpoint" / stage / "adapter" / "adapter_config.json").is_file():
            views[stage].backend.load_adapter(stage, out / "checkpoint" / stage / "adapter")
        if state["done"] or stage:
            logger.info("MAPGRPO: resumed (done: %s, in progress: %s at step %s)", state["done"], stage, state["step"])


def _demos(predictor: Any) -> list[dict[str, Any]]:
    return [d.toDict() if hasattr(d, "toDict") else dict(d) for d in (predictor.demos or [])]


def _expert_ids(view: Any, adapter: Any, signature: Any, outputs: dict[str, Any]) -> list[int]:
    """Token ids of c_best written in the adapter's output format, ending in EOS (as a sampled completion would)."""
    text = adapter.format_assistant_message_content(signature, outputs)
    tokenizer = view.backend.tokenizer
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [view.backend.eos_token_ids[0]]


def _parse(adapter: Any, signature: Any, text: str) -> dict[str, Any] | None:
    try:
        return adapter.parse(signature, text)
    except Exception:  # an unparseable candidate is data: it scores 0
        return None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _progress(show: bool, **kwargs: Any) -> Any:
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(**kwargs)
