"""Data-parallel training over several processes: the process group, sharding, and the collectives the trainer needs.

``accelerate launch --multi_gpu --num_processes W`` (or ``torchrun --nproc_per_node W``) starts W copies of a training
script with ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` set; :func:`setup` joins them into one ``torch.distributed``
process group through accelerate's ``PartialState``: NCCL with one GPU per process (``cuda:LOCAL_RANK``), gloo on the
CPU. Without a launcher every helper here is the one-process identity (world size 1, rank 0, no communication), so a
plain ``python`` run takes exactly the code path it always took.

Why ``--multi_gpu`` on a CPU too: accelerate's ``--cpu`` launcher spawns several processes only through ``mpirun``
(``--mpirun_hostfile``); without it ``accelerate launch --cpu --num_processes 2`` runs one process. ``--multi_gpu``
spawns the processes with torchrun's agent on any machine, and :func:`setup` picks gloo when there is no GPU.

Example:
    >>> from rolecall.optimizers.core import distributed
    >>> distributed.world_size(), distributed.rank(), distributed.is_main_process()
    (1, 0, True)
    >>> distributed.shard(list(range(5)), rank=1, world_size=2)  # contiguous, the first ranks take the remainder
    [3, 4]
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch

__all__ = [
    "all_reduce_gradients",
    "barrier",
    "broadcast_object",
    "broadcast_parameters",
    "is_main_process",
    "launched_world_size",
    "rank",
    "setup",
    "shard",
    "sum_over_processes",
    "world_size",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
"""Where torchrun, Intel MPI / MPICH, Open MPI and MVAPICH put the number of processes (accelerate reads the same)."""
_RANK_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")


def launched_world_size() -> int:
    """The number of processes the launcher started (1 without a launcher), read from the environment."""
    return _env_int(_WORLD_SIZE_VARS, 1)


def setup() -> int:
    """Joins the process group of a multi-process launch, once; returns the world size (1 without a launcher).

    Call it before loading the model in a script run with ``accelerate launch``: on GPUs it makes ``cuda`` mean this
    process's GPU (``cuda:LOCAL_RANK``). :class:`~rolecall.optimizers.core.trainer.AdapterTrainer` calls it too.
    A process group the script initialized itself (``torch.distributed.init_process_group``) is used as it is.
    """
    if not torch.distributed.is_available():
        return 1
    if torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    if launched_world_size() <= 1:
        return 1
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # gloo on the CPU, NCCL on GPUs
    logger.info("Joined the process group: rank %d of %d (%s, %s)", state.process_index, state.num_processes,
                state.backend, state.device)  # fmt: skip
    return world_size()


def world_size() -> int:
    """The number of processes in the initialized process group; 1 without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def rank() -> int:
    """This process's rank: the process group's, else the launcher's (``RANK``), else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return _env_int(_RANK_VARS, 0)


def is_main_process() -> bool:
    """Whether this process is rank 0: the one that writes checkpoints, metrics and plots."""
    return rank() == 0


def barrier() -> None:
    """Waits until every process got here (nothing to wait for in one process)."""
    if world_size() > 1:
        torch.distributed.barrier()


def shard(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """This rank's contiguous part of ``items``: W near-equal runs, the first ``len % W`` ranks one item longer.

    Contiguous, so the similar-length neighbours (and a GRPO group's completions) a sort put together stay together.

    Example:
        >>> [shard("abcde", r, 2) for r in range(2)], shard("a", 1, 2)
        ([['a', 'b', 'c'], ['d', 'e']], [])
    """
    size, extra = divmod(len(items), world_size)
    start = rank * size + min(rank, extra)
    return list(items[start : start + size + (rank < extra)])


def broadcast_object(obj: T, src: int = 0) -> T:
    """The main process's ``obj`` on every process (pickled); ``obj`` itself in one process."""
    if world_size() <= 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)  # staged on this process's GPU under NCCL
    return box[0]


@torch.no_grad()
def broadcast_parameters(params: Sequence[torch.Tensor], src: int = 0) -> None:
    """Copies the main process's values of ``params`` into every process's (in place; one flat collective)."""
    if world_size() <= 1 or not params:
        return
    flat = torch.cat([p.detach().reshape(-1).float() for p in params])
    torch.distributed.broadcast(flat, src=src)
    _unflatten_into(flat, params, [p.data for p in params])


@torch.no_grad()
def all_reduce_gradients(params: Sequence[torch.Tensor]) -> None:
    """Sums the gradients of ``params`` over the processes, in place (a missing gradient counts as zeros).

    Every process ends with the same gradients: the ones one process would have accumulated over all the processes'
    micro-batches, up to float summation order. Reduced in float32 in one flat buffer (one collective).
    Naive equivalent: ``for p in params: torch.distributed.all_reduce(p.grad)``.
    """
    if world_size() <= 1 or not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])
    torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    _unflatten_into(flat, params, [p.grad for p in params])


def sum_over_processes(values: Mapping[str, float]) -> dict[str, float]:
    """Each key's sum over the processes (a key a process lacks counts 0), in rank order: the same on every process.

    Example:
        >>> sum_over_processes({"tokens/loss": 3.0})  # one process
        {'tokens/loss': 3.0}
    """
    if world_size() <= 1:
        return dict(values)
    gathered: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(gathered, dict(values))
    total: dict[str, float] = {}
    for part in gathered:
        for key, value in part.items():
            total[key] = total.get(key, 0.0) + float(value)
    return total


def _unflatten_into(flat: torch.Tensor, like: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> None:
    offset = 0
    for p, target in zip(like, targets, strict=True):
        n = p.numel()
        target.copy_(flat[offset : offset + n].view_as(target).to(target.dtype))
        offset += n


def _env_int(names: Sequence[str], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default
