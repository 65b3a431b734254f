"""check_adapter_folder: a damaged PEFT adapter folder is one ModelLoadError naming the file, before PEFT reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolecall.errors import ModelLoadError
from rolecall.lm.adapter_files import check_adapter_folder, check_safetensors_file


@pytest.fixture
def backend(tiny_model, smollm_tokenizer):
    from rolecall.lm.backend import ModelBackend

    return ModelBackend(tiny_model, tokenizer=smollm_tokenizer, device="cpu", batching="static")


@pytest.fixture
def adapter_dir(tmp_path: Path, backend) -> Path:
    """A real adapter folder written by the backend (PEFT format) from the tiny model."""
    backend.ensure_adapter("plan")
    backend.save_adapter("plan", tmp_path / "plan")
    return tmp_path / "plan"


def test_intact_folder_passes(adapter_dir: Path) -> None:
    assert check_adapter_folder(adapter_dir) == adapter_dir


@pytest.mark.parametrize("keep", [0, 5, 0.5])
def test_truncated_weights_name_the_file(adapter_dir: Path, keep: float) -> None:
    weights = adapter_dir / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    with pytest.raises(ModelLoadError, match="adapter_model.safetensors is damaged") as err:
        check_adapter_folder(adapter_dir)
    assert "\n" not in str(err.value)


def test_trailing_bytes_are_damage(adapter_dir: Path) -> None:
    weights = adapter_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0" * 16)
    with pytest.raises(ModelLoadError, match="trailing bytes"):
        check_safetensors_file(weights)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"r": 8})])
def test_bad_config_names_the_file(adapter_dir: Path, text: str) -> None:
    (adapter_dir / "adapter_config.json").write_text(text)
    with pytest.raises(ModelLoadError, match="adapter_config.json is damaged"):
        check_adapter_folder(adapter_dir)


def test_missing_pieces(adapter_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such directory"):
        check_adapter_folder(tmp_path / "nowhere")
    (adapter_dir / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="holds no adapter weights"):
        check_adapter_folder(adapter_dir)
    (adapter_dir / "adapter_config.json").unlink()
    with pytest.raises(ModelLoadError, match="adapter_config.json is missing"):
        check_adapter_folder(adapter_dir)


def test_backend_load_rejects_damage_before_peft(adapter_dir: Path, backend) -> None:
    """The backend's load path checks first: a truncated file is one line naming it, and nothing is loaded."""
    weights = adapter_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    before = list(backend.adapters)
    with pytest.raises(ModelLoadError, match=str(weights)):
        backend.load_adapter("analysis", adapter_dir)
    assert backend.adapters == before
