"""Fine-tuning a ColBERT model on (question, gold passage, BM25 hard negative) triples with PyLate's contrastive loss.

For a batch of ``B`` triples ``(q_b, d_b^+, d_b^-)``, every query is scored by MaxSim against all ``2B`` passages of the
batch (its own positive, the other positives and every hard negative), and the loss is the cross-entropy of picking its
own positive (PyLate's ``losses.Contrastive``, in-batch negatives as in ColBERTv2, arXiv:2112.01488):

    s_{b,c} = sum_i max_j <q_{b,i}, d_{c,j}>                      for c over the 2B passages
    loss    = -1/B * sum_b log( exp(s_{b,b+} / tau) / sum_c exp(s_{b,c} / tau) )

Hard negatives come from BM25 (Karpukhin et al., 2020, DPR): for each training question, the best-ranked BM25 passage
that is not one of its gold supporting passages.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rolecall.errors import ConfigError
from rolecall.retrievers.base import Retriever
from rolecall.retrievers.bm25 import as_documents
from rolecall.retrievers.colbert import document_text
from rolecall.retrievers.colbert_index import import_pylate

__all__ = ["ColBERTTriple", "ColBERTTrainConfig", "hard_negative_triples", "fine_tune_colbert"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColBERTTriple:
    """One training triple: a question, a passage that answers it and a passage that looks like it but does not."""

    query: str
    positive: str
    negative: str


def hard_negative_triples(
    examples: Sequence[Any],
    retriever: Retriever,
    *,
    corpus: Sequence[Any] | None = None,
    depth: int = 20,
) -> list[ColBERTTriple]:
    """One triple per (example, gold passage): the question, the gold passage's ``title: text``, and as negative the
    best-ranked passage of ``retriever`` (BM25, typically) for the question that is not one of its gold passages.

    Args:
        examples: anything with ``question`` and ``supporting_ids`` (rolecall ``Example``\\ s of a training split).
        retriever: ranks the negatives; its passage ids must be the corpus ids.
        corpus: the documents the gold ids refer to (default: ``retriever.docs``).
        depth: how many ranked passages to look through for a non-gold one.

    Returns:
        The triples, in example order; examples without a gold passage in the corpus or without a non-gold passage
        in the top ``depth`` are skipped (counted in a DEBUG log line).

    Raises:
        ConfigError: if ``depth`` is smaller than 1, or no corpus is given and the retriever has no ``docs``.
    """
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}.")
    if corpus is None:
        corpus = getattr(retriever, "docs", None)
        if corpus is None:
            raise ConfigError(f"{type(retriever).__name__} has no .docs; pass corpus= with the documents.")
    by_id = {d.id: d for d in as_documents(corpus)}
    examples = list(examples)
    ranked = retriever.retrieve_batch([e.question for e in examples], k=depth)
    triples: list[ColBERTTriple] = []
    no_gold = no_negative = 0
    for example, hits in zip(examples, ranked, strict=True):
        gold_ids = set(example.supporting_ids)
        gold = [by_id[i] for i in example.supporting_ids if i in by_id]
        if not gold:
            no_gold += 1
            continue
        negative = next((p for p in hits if p.id not in gold_ids), None)
        if negative is None:
            no_negative += 1
            continue
        negative_text = document_text(negative.title, negative.text)
        triples += [ColBERTTriple(example.question, document_text(d.title, d.text), negative_text) for d in gold]
    logger.debug(
        "%d triples from %d examples (%d without gold passages, %d without a non-gold passage in the top %d)",
        len(triples),
        len(examples),
        no_gold,
        no_negative,
        depth,
    )
    return triples


@dataclass(kw_only=True)
class ColBERTTrainConfig:
    """Settings of :func:`fine_tune_colbert`."""

    learning_rate: float = 5e-5
    """AdamW learning rate. 5e-5 suits the MiniLM encoder with a fresh projection (``benchmarks/bench_retrieval.py``:
    10 minutes on 928 HotpotQA triples lift recall@5 from 0.66 to 0.75); PyLate uses 3e-6 to fine-tune an already
    trained ColBERT."""

    batch_size: int = 16
    """Triples per step; each query sees ``2 * batch_size - 1`` negatives (in-batch positives and hard negatives)."""

    epochs: int = 1
    """Passes over the triples (the run stops earlier at ``max_steps`` or ``max_minutes``)."""

    max_steps: int | None = None
    """Stop after this many optimizer steps (``None``: no limit)."""

    max_minutes: float | None = None
    """Stop at the first step boundary after this much wall time (``None``: no limit)."""

    warmup_steps: int = 10
    """Linear learning-rate warmup from 0, then constant."""

    weight_decay: float = 0.01
    """AdamW weight decay."""

    max_grad_norm: float = 1.0
    """Gradient clipping norm."""

    temperature: float = 1.0
    """Softmax temperature ``tau`` of the contrastive loss (1.0 is PyLate's default)."""

    seed: int = 0
    """Seeds the triple shuffling and dropout."""

    show_progress: bool = False
    """Show a tqdm bar over steps."""

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0 (5e-5 is a good start), got {self.learning_rate}.")
        if self.batch_size < 2:
            raise ConfigError(f"batch_size must be >= 2 (in-batch negatives need two triples), got {self.batch_size}.")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}.")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1 or None, got {self.max_steps}.")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ConfigError(f"max_minutes must be > 0 or None, got {self.max_minutes}.")
        if self.warmup_steps < 0 or self.weight_decay < 0 or not self.max_grad_norm > 0 or not self.temperature > 0:
            raise ConfigError(
                "warmup_steps and weight_decay must be >= 0, max_grad_norm and temperature > 0; got "
                f"{self.warmup_steps}, {self.weight_decay}, {self.max_grad_norm}, {self.temperature}."
            )


def _pylate_view(model: Any) -> Any:
    """The model as PyLate's ``losses.Contrastive`` expects it: ``forward(features)["token_embeddings"]``, plus the
    ``skiplist`` token ids it leaves out of document scoring and ``do_query_expansion``.

    The features carry their ``task`` (``"query"`` / ``"document"``), which the ``MultiVectorEncoder`` needs.
    """
    import torch
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    masks = [m for m in model if isinstance(m, MultiVectorMask)]
    skip = masks[0]._skiplist_ids if masks else None

    class PyLateView(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.skiplist = skip.tolist() if skip is not None else []
            self.do_query_expansion = True  # every query position is scored, as with PyLate's query expansion

        def forward(self, features: dict[str, Any]) -> dict[str, Any]:
            features = dict(features)
            task = features.pop("task", None)
            return self.model(features, task=task)

    return PyLateView()


def _features(model: Any, texts: list[str], task: str) -> dict[str, Any]:
    features = model.preprocess(texts, prompt=(model.prompts or {}).get(task), task=task)
    features["task"] = task
    return features


def _pad_to(features: dict[str, Any], length: int, pad_id: int) -> None:
    """Right-pad ``input_ids`` (with ``pad_id``), ``attention_mask`` and ``token_type_ids`` (with 0) to ``length``.

    PyLate's loss stacks the positive and negative columns, so both must have the same number of tokens.
    """
    import torch

    extra = length - features["input_ids"].shape[1]
    if extra <= 0:
        return
    for key, value in (("input_ids", pad_id), ("attention_mask", 0), ("token_type_ids", 0)):
        if key in features:
            features[key] = torch.nn.functional.pad(features[key], (0, extra), value=value)


def _batch(model: Any, triples: Sequence[ColBERTTriple]) -> list[dict[str, Any]]:
    """PyLate's ``[queries, positives, negatives]`` features for ``triples``."""
    queries = _features(model, [t.query for t in triples], "query")
    positives = _features(model, [t.positive for t in triples], "document")
    negatives = _features(model, [t.negative for t in triples], "document")
    length = max(positives["input_ids"].shape[1], negatives["input_ids"].shape[1])
    pad_id = model.tokenizer.pad_token_id or 0
    _pad_to(positives, length, pad_id)
    _pad_to(negatives, length, pad_id)
    return [queries, positives, negatives]


def fine_tune_colbert(
    model: Any, triples: Sequence[ColBERTTriple], config: ColBERTTrainConfig | None = None
) -> dict[str, float]:
    """Fine-tune ``model`` in place on ``triples`` with PyLate's contrastive loss (see the module docstring).

    The loop is written out: shuffle, batch, loss, backward, clip, AdamW step; it stops after ``epochs`` passes,
    ``max_steps`` steps or ``max_minutes`` of wall time, whichever comes first. A step whose loss is not finite is
    skipped (and counted), not applied. The model is left in eval mode.

    Args:
        model: a ``sentence_transformers.MultiVectorEncoder`` (:func:`~rolecall.retrievers.colbert.colbert_model`, or
            ``ColBERTRetriever(...).model``). Re-index the corpus afterwards: the document embeddings change.
        triples: training triples (:func:`hard_negative_triples`).
        config: training settings (defaults: :class:`ColBERTTrainConfig`).

    Returns:
        Flat metrics: ``loss/first``, ``loss/last``, ``loss/mean``, ``grad/norm_mean``, ``train/steps``,
        ``train/skipped_steps``, ``train/triples_seen``, ``train/epochs``, ``train/seconds``.

    Raises:
        ConfigError: if there are fewer triples than two (a batch needs an in-batch negative).
    """
    import torch

    config = config or ColBERTTrainConfig()
    triples = list(triples)
    if len(triples) < 2:
        raise ConfigError(f"fine_tune_colbert needs at least 2 triples, got {len(triples)}.")
    pylate = import_pylate()
    from pylate.losses import Contrastive

    loss_fn = Contrastive(_pylate_view(model), temperature=config.temperature)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(len(triples) / config.batch_size)
    total = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    logger.info(
        "Fine-tuning ColBERT (PyLate %s contrastive loss) on %d triples, batch %d, up to %d steps%s",
        pylate.__version__,
        len(triples),
        config.batch_size,
        total,
        f" or {config.max_minutes} min" if config.max_minutes else "",
    )
    rng = random.Random(config.seed)
    start = time.perf_counter()
    losses: list[float] = []
    grad_norms: list[float] = []
    step = skipped = seen = 0
    bar = None
    if config.show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="ColBERT fine-tuning", unit="step")
    model.train()
    done = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        for _epoch in range(config.epochs):
            order = list(range(len(triples)))
            rng.shuffle(order)
            for begin in range(0, len(order), config.batch_size):
                elapsed = time.perf_counter() - start
                done = step >= total or (config.max_minutes is not None and elapsed >= config.max_minutes * 60)
                if done:
                    break
                chunk = [triples[i] for i in order[begin : begin + config.batch_size]]
                if len(chunk) < 2:  # a lone last triple has no in-batch negative
                    continue
                for group in optimizer.param_groups:  # 1) linear warmup, 2) constant
                    group["lr"] = config.learning_rate * min(1.0, (step + 1) / max(1, config.warmup_steps))
                loss = loss_fn(_batch(model, chunk))
                step += 1
                if not torch.isfinite(loss):
                    logger.warning("Step %d: non-finite loss %s, skipped", step, loss.item())
                    optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                loss.backward()
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
                seen += len(chunk)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if done:
                break
    model.eval()
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - start
    nan = float("nan")
    metrics = {
        "loss/first": losses[0] if losses else nan,
        "loss/last": losses[-1] if losses else nan,
        "loss/mean": sum(losses) / len(losses) if losses else nan,
        "grad/norm_mean": sum(grad_norms) / len(grad_norms) if grad_norms else nan,
        "train/steps": float(step),
        "train/skipped_steps": float(skipped),
        "train/triples_seen": float(seen),
        "train/epochs": seen / len(triples),
        "train/seconds": seconds,
    }
    logger.info("ColBERT fine-tuning done: %s", {k: round(v, 4) for k, v in metrics.items()})
    return metrics
