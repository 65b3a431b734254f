"""MultiAgent-OPD: a hierarchical Leader-Searcher-Answerer team trained with on-policy distillation from a cascaded
Teacher (Zhao et al., arXiv 2610.23234, Sec. 3; PAPERS.md section 3).

Stage I (:mod:`rolecall.optimizers.opd_teacher`): GRPO on the cascaded Searcher -> Answerer workflow from the base,
R_S = 0.9 R_EM + 0.1 b_S and R_A = c_ij; its shared adapter is frozen as the Teacher π_T (``teacher_adapter``).

Stage II, on the :class:`~rolecall.programs.team.program.HierarchicalTeam` student, G team rollouts per question x:

    Leader    R_L,i   = 0.9 R_EM,i + 0.1 min(C_tool,i, 6)/6 - 1e-3 KL̂(π ‖ π_T)          (Eq. 6, KL in the reward)
    Answerer  R_A,i,j = c_ij - 1e-3 KL̂(π ‖ π_T)                                        (Eq. 2)
              Â_r    = (R_r - μ_r) / (σ_r + ε): Leader over the G rollouts, Answerer over the J candidates of its
                       request (its parent workflow)                                     (Eq. 1)
    Searcher  Â_t    = β M_t (log π_T(a_t|h_t) - log π_old(a_t|h_t)), β = 0.01, no KL    (Eq. 5)
    L        = -1/|T| Σ_t min(ρ_t Â_t, clip(ρ_t, 1-ε, 1+ε) Â_t)                         (PPO surrogate, token mean)

π_T scores the student's own Searcher completion on the student's own prompt ids (the same role prompt, subtask and
passages) with the Teacher adapter active; π_old is the sampling policy, the student's adapter before the update, both
computed once per sample (:func:`~rolecall.optimizers.opd_teacher.completion_logps`), which also give the Leader and
Answerer KL terms (KL̂ sums ``log π - log π_T`` over the role's tokens; a Leader's over all its turns in τ_i).

One loss for every role: a Leader or Answerer sample carries its scalar Â, which the ``token_advantage`` loss repeats
over the completion (A_t = Â), so its term is exactly the GRPO ``dapo`` surrogate, and all roles of a step train in one
optimizer step of the shared adapter. ``parameter_sharing="per_role"`` gives one stage per adapter (leader, searcher,
answerer), interleaved; each step runs its own rollouts and trains its adapter's samples only. The Teacher is one
shared adapter in either mode (the paper's Teacher is one model with role prompts), so π_T scores every role's
tokens, the Leader's too. Stage II trains the student as it is: the base for a fresh team, as in the paper.

``outcome_only=True`` is the ablation where Searchers learn from the team outcome instead: every turn of rollout i
carries Â = (R_EM,i - μ) / (σ + ε) over the G rollouts (R_EM, not R_L: the outcome alone, without the Leader's tool
bonus), with the same loss.

Retrieved passages carry no loss: a Searcher turn is a separate call whose prompt holds its notes; a completion is only
what the role wrote. :func:`evaluate_avg_pass_at_k` gives the paper's avg@4 / pass@4 with question-bootstrap
intervals.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from rolecall.errors import ConfigError
from rolecall.evaluation.metrics import exact_match
from rolecall.evaluation.stats import avg_pass_at_k
from rolecall.optimizers.core.base import WeightOptimizer
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.role_sampling import role_lm_overrides
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.mapgrpo_roles import GoldRecord, as_gold_record
from rolecall.optimizers.opd_config import OPDConfig
from rolecall.optimizers.opd_teacher import (
    OPDTeacher,
    TeamRollouts,
    answerer_samples,
    completion_logps,
    reward_metrics,
    role_samples,
    rollouts,
    steps_per_update,
    with_advantage,
)
from rolecall.optimizers.rewards.team import (
    TeamRewards,
    hierarchical_team_rewards,
    kl_penalized_reward,
    role_advantages,
    searcher_token_advantages,
)
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam

__all__ = ["OPD", "OPDConfig", "OPDTeacher", "evaluate_avg_pass_at_k"]

logger = logging.getLogger(__name__)


class OPD(WeightOptimizer[list[GoldRecord], TeamRollouts, TeamRollouts]):
    """MultiAgent-OPD: trains a HierarchicalTeam with role rewards and on-policy distillation of its Searchers from a
    cascaded Teacher trained first (see module; Zhao et al., arXiv 2610.23234).

    Args:
        config: an :class:`OPDConfig`; keyword arguments override its fields (``OPD(group_size=4)``).
        teacher: the CascadedTeam Stage I trains (default: one built on the student's retriever and LM, its shared
            adapter named ``teacher_adapter``).

    Example:
        >>> team = HierarchicalTeam(BM25(world.corpus), lm=LocalLM())                         # doctest: +SKIP
        >>> team.compile(optimizer=OPD(teacher_steps=20, steps=20), trainset=world.train)     # doctest: +SKIP
        >>> evaluate_avg_pass_at_k(team, world.test, k=4)["avg@4"]                            # doctest: +SKIP
    """

    def __init__(self, config: OPDConfig | None = None, *, teacher: CascadedTeam | None = None, **kw: Any) -> None:
        self.opd_config = cfg = OPDConfig.merged(config, kw)
        if teacher is not None and not cfg.train_teacher:
            raise ConfigError("OPD(teacher=...) is the workflow Stage I trains: use it with train_teacher=True")
        super().__init__(cfg.loop_config("interleaved"))
        self.teacher = teacher
        self.records: list[GoldRecord] = []

    # ------------------------------------------------------------------ Stage I and the frozen Teacher
    def teacher_program(self, student: HierarchicalTeam) -> CascadedTeam:
        """The cascade Stage I trains: ``teacher``, else one on the student's retriever and LM sharing one adapter."""
        if self.teacher is not None:
            return self.teacher
        return CascadedTeam(student.retriever, lm=student.lm, top_k=student.top_k, parameter_sharing="shared",
                            shared_adapter_name=self.opd_config.teacher_adapter,
                            max_passage_chars=student.max_passage_chars, max_notes_chars=student.max_notes_chars,
                            max_report_chars=student.max_report_chars)  # fmt: skip

    def stage_one(self, student: HierarchicalTeam, trainset: Sequence[Any]) -> None:
        """Stage I, then freeze: copy the trained adapter into ``teacher_adapter`` (when it has another name) and put
        a student adapter of the same name back to the base (the student starts from the base, as in the paper)."""
        cfg, backend = self.opd_config, self.backend(student)
        cascade = self.teacher_program(student)
        logger.info("OPD Stage I: GRPO on the cascaded Teacher")
        OPDTeacher(cfg).compile(cascade, trainset=trainset)
        (trained,) = cascade.adapter_roles()
        if trained != cfg.teacher_adapter:
            backend.copy_adapter(trained, cfg.teacher_adapter)
            if trained in student.adapter_roles():
                backend.delete_adapter(trained)
                backend.ensure_adapter(trained)  # the identity again: the base model

    def compile(self, student: Any, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **kw: Any) -> Any:
        """Stage I (unless ``train_teacher=False``), then Stage II on ``student``; returns the trained student.

        Raises:
            ConfigError: the program is not a HierarchicalTeam on a LocalLM, the trainset is empty, the Teacher
                adapter is missing (``train_teacher=False``) or is one of the student's adapters.
        """
        if not isinstance(student, HierarchicalTeam):
            raise ConfigError(f"OPD applies to the hierarchical_team program (HierarchicalTeam); got "
                              f"{type(student).__name__}")  # fmt: skip
        cfg = self.opd_config
        if cfg.teacher_adapter in student.adapter_roles():
            raise ConfigError(f"teacher_adapter={cfg.teacher_adapter!r} is one of the student's adapters "
                              f"{sorted(student.adapter_roles())}; give the Teacher another name")  # fmt: skip
        self.records = [as_gold_record(e) for e in trainset]
        if not self.records:
            raise ConfigError("OPD needs a non-empty trainset with gold answers")
        backend = self.backend(student)
        if cfg.train_teacher:
            self.stage_one(student, trainset)
        elif cfg.teacher_adapter not in backend.adapters:
            raise ConfigError(f"train_teacher=False needs the Teacher adapter {cfg.teacher_adapter!r} loaded "
                              f"(backend.load_adapter); loaded: {backend.adapters}")  # fmt: skip
        self.program = student
        return super().compile(student, trainset=trainset, valset=valset, **kw)

    # ------------------------------------------------------------------ Stage II: the weight-optimizer contract
    def stages(self, student: Any, trainset: Sequence[Any]) -> list[Stage]:
        """Shared mode: one stage on the team adapter; per-role mode: one stage per adapter (interleaved)."""
        cfg = self.opd_config
        trainer = TrainerConfig(
            loss="token_advantage",
            learning_rate=cfg.learning_rate,
            micro_batch_size=cfg.micro_batch_size,
            gradient_accumulation_steps=steps_per_update(student, cfg,
                                                         searcher_calls=student.max_steps * student.max_subtasks),
            epsilon=cfg.epsilon,
            temperature=cfg.temperature,
        )  # fmt: skip
        return [Stage(name=adapter, adapter=adapter, steps=cfg.steps, trainer=trainer, roles=tuple(roles))
                for adapter, roles in student.adapter_roles().items()]  # fmt: skip

    def collect(self, ctx: StepContext) -> list[GoldRecord]:
        """The step's ``questions_per_step`` training questions."""
        return ctx.take(self.records, min(self.opd_config.questions_per_step, len(self.records)))

    def generate(self, ctx: StepContext, batch: list[GoldRecord]) -> TeamRollouts:
        """G sampled team rollouts per question, all concurrent."""
        return TeamRollouts(batch=batch, groups=rollouts(self.program, batch, self.opd_config))

    def team_rewards(self, trajectory: Trajectory, record: GoldRecord) -> TeamRewards:
        """R_L and every R_A,i,j of one rollout, before the KL (Eq. 6, Eq. 2; a test may override it)."""
        return hierarchical_team_rewards(trajectory, record.answers, weights=self.opd_config.weights)

    def score(self, ctx: StepContext, team_rollouts: TeamRollouts) -> tuple[list[TrainingSample], dict[str, float]]:
        """The samples of the stage's adapter with their advantages (Leader and Answerer: role-normalized rewards with
        the KL toward π_T; Searcher: Eq. 5 per-token advantages, or the outcome with ``outcome_only``)."""
        scored_all: list[TeamRewards] = []
        samples: list[TrainingSample] = []
        counts = {"leader": 0, "searcher": 0, "answerer": 0}
        kl_terms: list[float] = []
        for record, preds in zip(team_rollouts.batch, team_rollouts.groups, strict=True):
            trajectories = [p.trajectory for p in preds]
            scored = [self.team_rewards(t, record) for t in trajectories]
            scored_all += scored
            group = self.group_samples(ctx.stage.adapter, trajectories, scored, kl_terms)
            for s in group:
                counts[s.role] = counts.get(s.role, 0) + 1
            samples += group
        metrics = {**reward_metrics(scored_all), **{f"samples/{r}": float(n) for r, n in counts.items()},
                   "groups/total": float(len(team_rollouts.batch))}  # fmt: skip
        if kl_terms:
            metrics["kl/teacher"] = sum(kl_terms) / len(kl_terms)
        return samples, metrics

    def group_samples(
        self, adapter: str, trajectories: list[Trajectory], scored: list[TeamRewards], kl_terms: list[float]
    ) -> list[TrainingSample]:
        """One question's G rollouts -> the samples of ``adapter`` with their advantages."""
        cfg, lm, adapter_of = self.opd_config, self.program.lm, self.program.adapter_name
        per = [{role: [s for s in _role_calls(t, lm, role, adapter_of) if s.adapter == adapter]
                for role in ("leader", "searcher", "answerer")} for t in trajectories]  # fmt: skip
        # log-probs are needed for Eq. 5 (Searchers) and for the KL (Leader, Answerer)
        scoring = [s for p in per for role, group in p.items() for s in group
                   if (not cfg.outcome_only if role == "searcher" else cfg.kl_coef > 0)]  # fmt: skip
        old, teacher = self.scores(scoring)

        def penalty(sample: TrainingSample) -> float:  # -kl_coef · KL̂(π ‖ π_T) of one sample
            if cfg.kl_coef == 0:
                return 0.0
            value = float(kl_penalized_reward(0.0, old[id(sample)], teacher[id(sample)],
                                              torch.tensor(sample.loss_mask), kl_coef=cfg.kl_coef,
                                              estimator=cfg.kl_estimator))  # fmt: skip
            kl_terms.append(-value / cfg.kl_coef)
            return value

        out: list[TrainingSample] = []
        r_l = [(r.leader or 0.0) + sum(penalty(s) for s in p["leader"]) for r, p in zip(scored, per, strict=True)]
        a_l = role_advantages(r_l).tolist()  # (G,) Eq. 1
        a_o = role_advantages([r.outcome for r in scored]).tolist()  # (G,) outcome-only Searchers
        for p, rewards, a_leader, a_outcome in zip(per, scored, a_l, a_o, strict=True):
            out += with_advantage(p["leader"], a_leader)
            r_a = [c + penalty(s) for c, s in zip(rewards.answerer, p["answerer"], strict=False)]
            if len(r_a) > 1:
                for sample, a in zip(p["answerer"], role_advantages(r_a).tolist(), strict=False):
                    out += with_advantage([sample], a)
            if cfg.outcome_only:
                out += with_advantage(p["searcher"], a_outcome)
                continue
            for s in p["searcher"]:
                a_t = searcher_token_advantages(teacher[id(s)], old[id(s)], torch.tensor(s.loss_mask), beta=cfg.beta)
                out.append(replace(s, advantage=None, token_advantages=a_t.tolist()))
        return out

    def scores(self, samples: list[TrainingSample]) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """log π_old (each sample's own adapter before the update) and log π_T of every sample's completion, by id."""
        cfg, backend = self.opd_config, self.backend(self.program)
        old: dict[int, torch.Tensor] = {}
        for adapter in dict.fromkeys(s.adapter for s in samples):
            group = [s for s in samples if s.adapter == adapter]
            values = completion_logps(backend, group, adapter, temperature=cfg.temperature)
            old.update(zip(map(id, group), values, strict=True))
        values = completion_logps(backend, samples, cfg.teacher_adapter, temperature=cfg.temperature)
        return old, dict(zip(map(id, samples), values, strict=True))


def _role_calls(trajectory: Trajectory, lm: Any, role: str, adapter_of: Any) -> list[TrainingSample]:
    """The samples of ``role`` in one rollout: one per call (Leader, Searcher turns) or per candidate (Answerer)."""
    if role == "answerer":
        return answerer_samples(trajectory, lm, adapter_of)
    return role_samples(trajectory, lm, role, adapter_of)


# ---------------------------------------------------------------------------------------------- evaluation
def evaluate_avg_pass_at_k(
    program: Any,
    examples: Sequence[Any],
    *,
    k: int = 4,
    temperature: float = 0.6,
    top_p: float = 0.95,
    num_threads: int = 8,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, float]:
    """The paper's evaluation: k independent runs per question (every role sampled at ``temperature``/``top_p``;
    the paper: 4 runs, 0.6, 0.95, one Answerer candidate), strict EM of each run's answer, then avg@k and pass@k with
    question-bootstrap ``1 - alpha`` intervals (:func:`~rolecall.evaluation.stats.avg_pass_at_k`).

    Returns:
        ``{"avg@k", "avg@k/lo", "avg@k/hi", "pass@k", "pass@k/lo", "pass@k/hi", "questions", "k"}`` (k as a number).

    Raises:
        ValueError: ``k < 1`` or no examples.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1 runs per question; got {k}")
    records = [as_gold_record(e) for e in examples]
    if not records:
        raise ValueError("evaluate_avg_pass_at_k needs at least one example")
    jobs = [r for r in records for _ in range(k)]
    with role_lm_overrides(program, {role: {"temperature": temperature, "top_p": top_p} for role in program.roles}):
        preds = parallel_map(lambda r: program(question=r.question), jobs, max_workers=num_threads)
    scores = [exact_match(str(p.answer or ""), r.answers) for p, r in zip(preds, jobs, strict=True)]
    per_question = [scores[i : i + k] for i in range(0, len(scores), k)]
    return avg_pass_at_k(per_question, n_boot=n_boot, alpha=alpha, seed=seed)
