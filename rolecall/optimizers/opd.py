"""MultiAgent-OPD: a hierarchical Leader-Searcher-Answerer team trained with on-policy distillation from a cascaded
Teacher (Zhao et al., arXiv 2610.23234, Sec. 3; PAPERS.md section 3).

Stage I (:mod:`rolecall.optimizers.opd_teacher`): GRPO on the cascaded Searcher -> Answerer workflow from the base,
R_S = 0.9 R_EM + 0.1 b_S and R_A = c_ij; its shared adapter is frozen as the Teacher π_T (``teacher_adapter``).

Stage II, on the :class:`~rolecall.programs.team.program.HierarchicalTeam` student, G team rollouts per question x:

    Leader    R_L,i   = 0.9 R_EM,i + 0.1 min(C_tool,i, 6)/6 [- 1e-3 KL̂(π ‖ π_T)]        (Eq. 6, KL in the reward)
    Answerer  R_A,i,j = c_ij - 1e-3 KL̂(π ‖ π_T)                                        (Eq. 2)
              Â_r    = (R_r - μ_r) / (σ_r + ε): Leader over the G rollouts, Answerer over the J candidates of its
                       request (its parent workflow)                                     (Eq. 1)
    Searcher  Â_t    = β M_t (log π_T(a_t|h_t) - log π_old(a_t|h_t)), no KL               (Eq. 5)
    L        = -1/|T| Σ_t min(ρ_t Â_t, clip(ρ_t, 1-ε, 1+ε) Â_t)                         (PPO surrogate, token mean)

(the bracketed Leader KL only with ``"leader"`` in ``kl_roles``, see below).

What the paper does and what :class:`OPDConfig` does by default (the paper's setting stays one option away):

- KL̂ per token (``kl_reduction="mean"``): KL̂ = Σ_t M_t (log π - log π_T) / Σ_t M_t over the role's generated tokens,
  a Leader's over all its tokens in τ_i (token-weighted across its turns). The paper sums (``"sum"``): a longer
  response pays more, and one more Leader turn cost ~0.04 reward against the +0.017 the tool bonus pays for a search
  step, a push toward fewer searches that has nothing to do with the Teacher.
- KL for the roles the Teacher has played (``kl_roles=("answerer",)``): the cascaded Teacher never played the Leader,
  so log π_T on Leader tokens measures a role it does not know (kl/teacher 37-43 nats there). The paper:
  ``("leader", "answerer")``.
- Groups without a task signal are skipped: a Leader group whose R_L are all equal before the KL (the many questions
  every rollout answers alike), or an Answerer request whose c_ij are, gives no samples (``groups/skipped``,
  ``groups/informative``, ``answerer/skipped_requests``); otherwise σ + ε with ε = 1e-4 turns the KL's tiny
  differences into unit-size advantages. ``advantage_scale="none"`` drops the division, Â = R - μ (Dr. GRPO).
- β = 1.0 (the paper: 0.01): here the Leader and Answerer advantages are unit-size and share one optimizer step of the
  adapter with the Searcher tokens, so β = 0.01 made distillation ~1% of the gradient. ``advantage/searcher_share``
  (Σ over Searcher tokens of |A_t| / Σ over all trained tokens) and ``advantage/abs_mean`` show the balance;
  ``kl/teacher/<role>`` the per-token KL of each scored role, ``kl/teacher`` the mean KL̂ that entered the rewards.
- A Teacher check before Stage II (``teacher_check_questions``, :meth:`OPD.check_teacher`): the Teacher and the
  starting student answer the same questions greedily and are compared question by question; a warning when the
  Teacher is not better (``teacher_check.json``). It runs before the loop's clock starts, so Stage II's time budget
  does not pay for it.

π_T scores the student's own completion on the student's own prompt ids (the same role prompt, subtask and
passages) with the Teacher adapter active; π_old is the sampling policy, the student's adapter before the update, both
computed once per sample (:func:`~rolecall.optimizers.opd_teacher.completion_logps`), for the Searchers (Eq. 5) and
the samples of the ``kl_roles`` that train.

One loss for every role: a Leader or Answerer sample carries its scalar Â, which the ``token_advantage`` loss repeats
over the completion (A_t = Â), so its term is exactly the GRPO ``dapo`` surrogate, and all roles of a step train in one
optimizer step of the shared adapter. ``parameter_sharing="per_role"`` gives one stage per adapter (leader, searcher,
answerer), interleaved; each step runs its own rollouts and trains its adapter's samples only. The Teacher is one
shared adapter in either mode (the paper's Teacher is one model with role prompts), so π_T can score every role's
tokens. Stage II trains the student as it is: the base for a fresh team, as in the paper.

``outcome_only=True`` is the ablation where Searchers learn from the team outcome instead: every turn of rollout i
carries Â = (R_EM,i - μ) / (σ + ε) over the G rollouts (R_EM, not R_L: the outcome alone, without the Leader's tool
bonus; ``advantage_scale`` applies), with the same loss.

Retrieved passages carry no loss: a Searcher turn is a separate call whose prompt holds its notes; a completion is only
what the role wrote. :func:`evaluate_avg_pass_at_k` gives the paper's avg@4 / pass@4 with question-bootstrap
intervals.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rolecall.errors import ConfigError
from rolecall.evaluation.compare import format_comparison, paired_comparison
from rolecall.evaluation.metrics import exact_match
from rolecall.evaluation.stats import avg_pass_at_k
from rolecall.optimizers.core import distributed
from rolecall.optimizers.core.base import WeightOptimizer
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.grpo.advantages import all_equal
from rolecall.optimizers.core.policy_update import policy_passes
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
    KLEstimator,
    TeamRewards,
    hierarchical_team_rewards,
    kl_penalized_reward,
    role_advantages,
    searcher_token_advantages,
    teacher_kl,
)
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam

__all__ = [
    "OPD",
    "OPDConfig",
    "OPDTeacher",
    "StageTwoStats",
    "advantage_metrics",
    "evaluate_avg_pass_at_k",
    "greedy_exact_match",
]

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
        self.teacher_check: dict[str, Any] | None = None
        """The Teacher check's result (:meth:`check_teacher`), after :meth:`compile`; None when it did not run."""

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
        # before the loop's clock starts: the check is not charged to Stage II's time budget
        self.teacher_check = self.check_teacher(student, valset or trainset, source="valset" if valset else "trainset")
        return super().compile(student, trainset=trainset, valset=valset, **kw)

    # ------------------------------------------------------------------ the Teacher check before Stage II
    def teacher_check_program(self, student: HierarchicalTeam) -> CascadedTeam:
        """The frozen Teacher as a program: the Stage I cascade (its options, prompts and demos; see
        :meth:`teacher_program`) with every role bound to ``teacher_adapter``."""
        cfg = self.opd_config
        cascade = copy.deepcopy(self.teacher_program(student))  # predictors copied; the LM and retriever shared
        (adapter,) = cascade.adapter_roles()
        if adapter != cfg.teacher_adapter:  # a passed-in cascade trained on its own adapter, copied to the Teacher's
            trained = adapter in cascade.demo_free_adapters
            cascade.options = replace(cascade.options, shared_adapter_name=cfg.teacher_adapter)
            cascade.shared_adapter_name = cfg.teacher_adapter
            cascade.adapter_groups = {cfg.teacher_adapter: list(cascade.roles)}
            cascade.demo_free_adapters = {cfg.teacher_adapter} if trained else set()
            cascade.bind_role_adapters(cascade.lm)
        return cascade

    def check_teacher(
        self, student: HierarchicalTeam, examples: Sequence[Any], *, source: str = ""
    ) -> dict[str, Any] | None:
        """Is π_T better than the student it is about to teach? Both answer the first ``teacher_check_questions`` of
        ``examples`` greedily (every role at temperature 0), scored by exact match, then compared question by
        question (:func:`~rolecall.evaluation.compare.paired_comparison`, A = the student, B = the Teacher).

        The result is logged, returned (``PairedComparison.to_dict()`` plus ``source``) and written to
        ``<output_dir>/teacher_check.json``; when the Teacher's EM is not above the student's, a warning says that
        distillation may pull the student down. A question whose run raises scores EM 0. On ``resume`` an existing
        ``teacher_check.json`` is kept (the student is then no longer at its start). None when the check is off
        (``teacher_check_questions=0``) or there are no questions.
        """
        cfg = self.opd_config
        path = Path(cfg.output_dir) / "teacher_check.json" if cfg.output_dir is not None else None
        if cfg.teacher_check_questions == 0:
            return None
        if cfg.resume and path is not None and path.is_file():
            logger.info("OPD Teacher check: kept from %s (resumed run)", path)
            return json.loads(path.read_text())
        records = [as_gold_record(e) for e in list(examples)[: cfg.teacher_check_questions]]
        if not records:
            return None
        logger.info("OPD Teacher check: the Teacher and the student answer %d %s questions greedily", len(records),
                    source or "given")  # fmt: skip
        em_student = greedy_exact_match(student, records, num_threads=cfg.num_threads, name="student")
        em_teacher = greedy_exact_match(self.teacher_check_program(student), records, num_threads=cfg.num_threads,
                                        name="Teacher")  # fmt: skip
        comparison = paired_comparison(em_student, em_teacher, names=("student", "teacher"))
        logger.info("OPD Teacher check before Stage II (A = student, B = Teacher):\n%s", format_comparison(comparison))
        if comparison.em_diff <= 0:
            logger.warning("OPD: the Teacher (EM %.3f) is not better than the student it teaches (EM %.3f) on %d "
                           "questions: Teacher won %d, lost %d, EM diff %+.3f (paired 95%% CI %+.3f .. %+.3f, McNemar "
                           "p = %.3g); distillation may pull the student down", comparison.em_b, comparison.em_a,
                           comparison.n, comparison.won, comparison.lost, comparison.em_diff, comparison.ci_low,
                           comparison.ci_high, comparison.p_value)  # fmt: skip
        result = {**comparison.to_dict(), "source": source}
        if path is not None and distributed.is_main_process():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2) + "\n")
        return result

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
            **cfg.trainer_fields(),
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
        the KL toward π_T for the ``kl_roles``; Searcher: Eq. 5 per-token advantages, or the outcome with
        ``outcome_only``), and the step's metrics (:meth:`StageTwoStats.metrics`, :func:`advantage_metrics`)."""
        scored_all: list[TeamRewards] = []
        samples: list[TrainingSample] = []
        stats = StageTwoStats()
        for record, preds in zip(team_rollouts.batch, team_rollouts.groups, strict=True):
            trajectories = [p.trajectory for p in preds]
            scored = [self.team_rewards(t, record) for t in trajectories]
            scored_all += scored
            samples += self.group_samples(ctx.stage.adapter, trajectories, scored, stats)
        counts = {"leader": 0, "searcher": 0, "answerer": 0}
        for s in samples:
            counts[s.role] = counts.get(s.role, 0) + 1
        metrics = {**reward_metrics(scored_all), **{f"samples/{r}": float(n) for r, n in counts.items()},
                   "groups/total": float(len(team_rollouts.batch)), **stats.metrics(),
                   **advantage_metrics(samples)}  # fmt: skip
        return samples, metrics

    def update(self, ctx: StepContext, samples: list[TrainingSample], trainer: Any) -> dict[str, float]:
        """``num_iterations`` optimizer passes over the step's samples (:func:`policy_passes`)."""
        return policy_passes(trainer, samples, self.opd_config.num_iterations)

    def group_samples(
        self,
        adapter: str,
        trajectories: list[Trajectory],
        scored: list[TeamRewards],
        stats: StageTwoStats | None = None,
    ) -> list[TrainingSample]:
        """One question's G rollouts -> the samples of ``adapter`` with their advantages (see module).

        A Leader group whose R_L are all equal before the KL, or an Answerer request whose c_ij are, carries no task
        signal: it gives no samples (and is not scored), so the KL's tiny differences are never normalized into
        unit-size advantages. ``stats`` (when given) counts the groups and collects the KL toward π_T.
        """
        cfg, lm, adapter_of = self.opd_config, self.program.lm, self.program.adapter_name
        stats = stats if stats is not None else StageTwoStats()
        kl_roles = set(cfg.kl_roles) if cfg.kl_coef > 0 else set()
        calls = [{role: _role_calls(t, lm, role, adapter_of) for role in ("leader", "searcher", "answerer")}
                 for t in trajectories]  # fmt: skip
        per = [{role: [s for s in group if s.adapter == adapter] for role, group in c.items()} for c in calls]
        leader_informative = not all_equal([r.leader or 0.0 for r in scored])
        stats.leader_groups += 1
        stats.leader_skipped += not leader_informative
        # c_ij of each rollout's candidates that became samples (before the KL); a request with no spread is skipped
        candidate_rewards = [[c for c, _ in zip(r.answerer, c_["answerer"], strict=False)]
                             for r, c_ in zip(scored, calls, strict=True)]  # fmt: skip
        answer_informative = [len(c) > 1 and not all_equal(c) for c in candidate_rewards]
        stats.answerer_requests += sum(1 for c in candidate_rewards if c)
        stats.answerer_skipped += sum(1 for c, ok in zip(candidate_rewards, answer_informative, strict=True)
                                      if c and not ok)  # fmt: skip

        def needs_logps(role: str, answers_ok: bool) -> bool:
            """Eq. 5 (Searchers), or the KL of a kl_roles sample that trains (its group has a spread)."""
            if role == "searcher":
                return not cfg.outcome_only
            return role in kl_roles and (leader_informative if role == "leader" else answers_ok)

        scoring = [s for p, answers_ok in zip(per, answer_informative, strict=True) for role, group in p.items()
                   if needs_logps(role, answers_ok) for s in group]  # fmt: skip
        old, teacher = self.scores(scoring)
        for s in scoring:
            stats.add_kl(s.role, old[id(s)], teacher[id(s)], torch.tensor(s.loss_mask), estimator=cfg.kl_estimator)

        def penalized(reward: float, samples: list[TrainingSample]) -> float:
            """R - kl_coef · KL̂(π ‖ π_T) over all the tokens of ``samples`` (one role's, token-weighted)."""
            if not samples or samples[0].role not in kl_roles:
                return reward
            logps = torch.cat([old[id(s)] for s in samples])
            teacher_logps = torch.cat([teacher[id(s)] for s in samples])
            mask = torch.cat([torch.tensor(s.loss_mask) for s in samples])
            stats.kl.append(float(teacher_kl(logps, teacher_logps, mask, estimator=cfg.kl_estimator,
                                             reduction=cfg.kl_reduction)))  # fmt: skip
            return float(kl_penalized_reward(reward, logps, teacher_logps, mask, kl_coef=cfg.kl_coef,
                                             estimator=cfg.kl_estimator, reduction=cfg.kl_reduction))  # fmt: skip

        out: list[TrainingSample] = []
        if leader_informative:  # Eq. 6 with the KL, then Eq. 1 over the G rollouts
            r_l = [penalized(r.leader or 0.0, p["leader"]) for r, p in zip(scored, per, strict=True)]
            for p, a in zip(per, role_advantages(r_l, scale=cfg.advantage_scale).tolist(), strict=True):
                out += with_advantage(p["leader"], a)
        a_o = role_advantages([r.outcome for r in scored], scale=cfg.advantage_scale).tolist()  # outcome-only
        for p, c, answers_ok, a_outcome in zip(per, candidate_rewards, answer_informative, a_o, strict=True):
            if answers_ok:  # Eq. 2 with the KL, then Eq. 1 over the request's candidates
                r_a = [penalized(c_j, [s]) for c_j, s in zip(c, p["answerer"], strict=False)]
                if len(r_a) > 1:  # the stage's own candidates (all of them, or none in another adapter's stage)
                    for sample, a in zip(p["answerer"], role_advantages(r_a, scale=cfg.advantage_scale).tolist(),
                                         strict=False):  # fmt: skip
                        out += with_advantage([sample], a)
            if cfg.outcome_only:
                out += with_advantage(p["searcher"], a_outcome)
                continue
            for s in p["searcher"]:  # Eq. 5
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


@dataclass
class StageTwoStats:
    """What one Stage II step's groups add up to: the skipped groups and the KL toward π_T (for its metrics)."""

    leader_groups: int = 0
    """Leader groups (questions) seen."""
    leader_skipped: int = 0
    """Leader groups whose R_L were all equal before the KL: no Leader samples."""
    answerer_requests: int = 0
    """Answerer requests (one per rollout) with at least one candidate sample."""
    answerer_skipped: int = 0
    """Requests whose candidates' c_ij were all equal (or that had one candidate): no Answerer samples."""
    kl: list[float] = field(default_factory=list)
    """KL̂ of each penalized reward, as it entered it (``kl_reduction``)."""
    kl_tokens: dict[str, list[float]] = field(default_factory=dict)
    """role -> [Σ_t kl_t, number of tokens] over the role's scored samples."""

    def add_kl(self, role: str, logps: torch.Tensor, teacher_logps: torch.Tensor, mask: torch.Tensor, *,
               estimator: KLEstimator = "k1") -> None:  # fmt: skip
        """Tally Σ_t M_t kl_t and Σ_t M_t of one scored sample of ``role``."""
        total = self.kl_tokens.setdefault(role, [0.0, 0.0])
        total[0] += float(teacher_kl(logps, teacher_logps, mask, estimator=estimator, reduction="sum"))
        total[1] += float(mask.sum())

    def metrics(self) -> dict[str, float]:
        """``groups/skipped``, ``groups/informative`` (Leader groups), ``answerer/requests``,
        ``answerer/skipped_requests``, ``kl/teacher`` (mean KL̂ of the penalized rewards) and ``kl/teacher/<role>``
        (Σ kl_t / Σ tokens over the role's scored samples: the per-token KL of every role that was scored)."""
        out = {"groups/skipped": float(self.leader_skipped),
               "groups/informative": float(self.leader_groups - self.leader_skipped),
               "answerer/requests": float(self.answerer_requests),
               "answerer/skipped_requests": float(self.answerer_skipped)}  # fmt: skip
        if self.kl:
            out["kl/teacher"] = sum(self.kl) / len(self.kl)
        for role, (total, tokens) in self.kl_tokens.items():
            if tokens > 0:
                out[f"kl/teacher/{role}"] = total / tokens
        return out


def advantage_metrics(samples: Sequence[TrainingSample]) -> dict[str, float]:
    """How the step's advantage mass splits between the roles, over the trained tokens (loss mask 1):
    ``advantage/abs_mean`` = Σ_t |A_t| / #tokens and ``advantage/searcher_share`` = Σ_{Searcher t} |A_t| / Σ_t |A_t|
    (a scalar-advantage sample counts |Â| once per loss token; 0 when nothing trains).

    Example:
        >>> from rolecall.optimizers.core.sample import TrainingSample
        >>> leader = TrainingSample(role="leader", adapter="team", prompt_ids=[1], completion_ids=[2, 3],
        ...                         advantage=-1.0)
        >>> searcher = TrainingSample(role="searcher", adapter="team", prompt_ids=[1], completion_ids=[2, 3],
        ...                           token_advantages=[0.5, 1.5])
        >>> advantage_metrics([leader, searcher])  # (0.5 + 1.5) / (1 + 1 + 0.5 + 1.5), 4 / 4 tokens
        {'advantage/abs_mean': 1.0, 'advantage/searcher_share': 0.5}
    """
    total = searcher = tokens = 0.0
    for s in samples:
        mass = sum(abs(a) for a, m in zip(s.per_token_advantages(), s.loss_mask or (), strict=True) if m)
        total += mass
        tokens += s.num_loss_tokens
        if s.role == "searcher":
            searcher += mass
    return {"advantage/abs_mean": total / tokens if tokens else 0.0,
            "advantage/searcher_share": searcher / total if total > 0 else 0.0}  # fmt: skip


def _role_calls(trajectory: Trajectory, lm: Any, role: str, adapter_of: Any) -> list[TrainingSample]:
    """The samples of ``role`` in one rollout: one per call (Leader, Searcher turns) or per candidate (Answerer)."""
    if role == "answerer":
        return answerer_samples(trajectory, lm, adapter_of)
    return role_samples(trajectory, lm, role, adapter_of)


# ---------------------------------------------------------------------------------------------- evaluation
def greedy_exact_match(
    program: Any, records: Sequence[GoldRecord], *, num_threads: int = 8, name: str = "program"
) -> dict[str, float]:
    """Question id (``q<i>``, the position in ``records``) -> exact match of ``program``'s greedy answer, every role
    at temperature 0 (the program's own settings come back afterwards). A run that raises scores 0 and is logged."""

    def run(item: tuple[int, GoldRecord]) -> float:
        i, record = item
        try:
            pred = program(question=record.question)
        except Exception as exc:  # one failed question must not end a training run
            logger.warning("OPD Teacher check: the %s raised on question %d (%.80r): %s: %s; scored EM 0", name, i,
                           record.question, type(exc).__name__, exc)  # fmt: skip
            return 0.0
        return exact_match(str(pred.answer or ""), record.answers)

    with role_lm_overrides(program, {role: {"temperature": 0.0} for role in program.roles}):
        scores = parallel_map(run, list(enumerate(records)), max_workers=num_threads)
    return {f"q{i}": score for i, score in enumerate(scores)}


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
