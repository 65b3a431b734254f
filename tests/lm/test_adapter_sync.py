"""AdapterPublisher: each created or stepped adapter is written to a fresh folder and published once per version."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rolecall.lm import LocalLM
from rolecall.lm.adapter_sync import AdapterPublisher
from tests.conftest import make_tiny_llama


@pytest.fixture
def lm(smollm_tokenizer):
    return LocalLM(model=make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer, cache=False)


def _bump_lora_b(lm: LocalLM, adapter: str) -> None:
    with torch.no_grad():
        for name, p in lm.backend.model.named_parameters():
            if f".{adapter}." in name and "lora_B" in name:
                p.add_(0.01)
    lm.backend.mark_updated(adapter)


def test_publishes_on_create_and_update_with_the_current_weights(lm, tmp_path):
    published: list[tuple[str, Path]] = []
    publisher = AdapterPublisher(lm.backend, lambda name, path: published.append((name, path)), sync_dir=tmp_path)
    lm.for_role("plan")
    assert [n for n, _ in published] == ["plan"]
    _bump_lora_b(lm, "plan")
    assert [n for n, _ in published] == ["plan", "plan"]
    newest = published[-1][1]
    assert (newest / "adapter_config.json").is_file()
    # the folder holds the stepped weights: loading it as another adapter reproduces them
    lm.backend.load_adapter("copy", newest)
    params = dict(lm.backend.model.named_parameters())
    for name, p in params.items():
        if ".plan." in name and "lora_" in name:
            torch.testing.assert_close(params[name.replace(".plan.", ".copy.")], p)
    assert publisher.stats["pushes"] == 3  # plan v0, plan v1, and the loaded copy
    # only the newest version of an adapter is kept on disk
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == [newest.name]


def test_push_is_a_no_op_when_the_version_is_already_published(lm, tmp_path):
    calls = []
    publisher = AdapterPublisher(lm.backend, lambda name, path: calls.append(name), sync_dir=tmp_path)
    lm.for_role("plan")
    assert publisher.push("plan") is None
    assert calls == ["plan"]


def test_a_failed_publish_is_counted_and_retried_by_the_next_push(lm, tmp_path):
    outcomes = [RuntimeError("server down"), None]

    def publish(name: str, path: Path) -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    publisher = AdapterPublisher(lm.backend, publish, sync_dir=tmp_path)
    lm.for_role("plan")  # the first publish fails; creating the adapter still succeeds
    assert publisher.stats["push_failures"] == 1 and publisher.published == {}
    assert publisher.push("plan") is not None
    assert publisher.published == {"plan": 0} and publisher.stats["pushes"] == 1
