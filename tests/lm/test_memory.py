"""rolecall.lm.memory: freed KV-cache-sized buffers must not stay resident in glibc's heap.

The malloc cases run in a fresh interpreter: malloc's settings are process-wide and cannot be undone.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from rolecall.errors import ConfigError
from rolecall.lm import memory
from rolecall.lm.backend import ModelBackend
from rolecall.lm.generation import GenerationRequest

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="malloc tuning is glibc-only"
)

# One large free first raises glibc's dynamic mmap threshold to 30 MiB, as the batcher's first freed KV buffer does.
# Then a KV-cache-sized buffer is carved from the main heap, unless the threshold is pinned; freed below a live
# buffer, it leaves a hole that stays resident until malloc_trim hands its pages back.
_WORKLOAD = r"""
import json
import torch
from rolecall.lm import memory
memory.limit_heap_fragmentation()
warm = torch.ones(30 << 20, dtype=torch.uint8); del warm
buf = torch.ones(24 << 20, dtype=torch.uint8)
with open("/proc/self/maps") as f:
    heap = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in f if line.rstrip().endswith("[heap]")]
on_heap = any(lo <= buf.data_ptr() < hi for lo, hi in heap)
above = torch.ones(1 << 20, dtype=torch.uint8)  # a live buffer above it: the heap cannot shrink from the top
del buf
freed = memory.resident_bytes()["rss"]
memory.trim_heap()
trimmed = memory.resident_bytes()["rss"]
print(json.dumps({"pinned": memory._pinned is not None, "on_heap": on_heap, "released_mb": (freed - trimmed) / 2**20}))
"""


def _run(policy: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    env["ROLECALL_MALLOC_TUNE"] = policy
    out = subprocess.run(
        [sys.executable, "-c", _WORKLOAD], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_mmap_policy_keeps_kv_sized_buffers_off_the_heap():
    assert _run("0") | {"released_mb": None} == {"pinned": False, "on_heap": True, "released_mb": None}
    mmap = _run("mmap")
    assert mmap["pinned"] is True and mmap["on_heap"] is False


@glibc_only
def test_trim_hands_a_freed_heap_buffer_back():
    out = _run("trim")
    assert out["pinned"] is False and out["on_heap"] is True
    assert out["released_mb"] > 16, out  # most of the 24 MiB hole; without the trim it would stay resident


def test_policy_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("ROLECALL_MALLOC_TUNE", "off")
    assert memory.heap_policy() == "off" and memory.limit_heap_fragmentation() is None
    monkeypatch.setenv("ROLECALL_MALLOC_TUNE", "bogus")
    with pytest.raises(ConfigError, match="trim, mmap or 0"):
        memory.heap_policy()
    if memory._glibc() is not None:
        monkeypatch.delenv("ROLECALL_MALLOC_TUNE")
        assert memory.heap_policy() == "trim"
        assert isinstance(memory.limit_heap_fragmentation(), memory.HeapTrimmer)
        monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # the user tuned malloc: leave it to them
        assert memory.heap_policy() == "off"


def test_trimmer_waits_its_interval():
    trimmer = memory.HeapTrimmer(interval_s=3600)
    assert trimmer.maybe_trim() is False and trimmer.trims == 0
    trimmer.interval_s = 0
    assert trimmer.maybe_trim() is True and trimmer.trims == 1


def test_pin_rejects_a_nonpositive_threshold():
    with pytest.raises(ValueError, match="positive"):
        memory.pin_mmap_threshold(0)


def test_resident_bytes_reports_rss_and_peak():
    r = memory.resident_bytes()
    if platform.system() != "Linux":
        assert r == {}
    else:
        assert 0 < r["rss"] <= r["peak"]


@glibc_only
@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_cpu_backend_trims_while_it_generates(monkeypatch, tiny_model, smollm_tokenizer, batching):
    monkeypatch.delenv("ROLECALL_MALLOC_TUNE", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    backend = ModelBackend(tiny_model, tokenizer=smollm_tokenizer, device="cpu", batching=batching)
    try:
        assert isinstance(backend.heap_trimmer, memory.HeapTrimmer)
        backend.heap_trimmer.interval_s = 0
        prompt = smollm_tokenizer("Name a colour.")["input_ids"]
        backend.generate([GenerationRequest(prompt_ids=prompt, max_tokens=4)])
        assert backend.heap_trimmer.trims >= 1
    finally:
        backend.batcher.close()
