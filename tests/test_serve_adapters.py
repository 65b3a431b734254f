"""``rolecall serve``'s adapter lifecycle when a load fails: the server is left exactly as before (no phantom adapter,
the name reusable, an in-place reload's old weights still served), and ``rolecall serve --adapter`` names a damaged
adapter file in one line before the model loads."""

from __future__ import annotations

import copy
import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from rolecall.cli import main
from rolecall.lm import LocalLM
from rolecall.lm.backend import default_lora_config
from rolecall.serve import RolecallServer
from tests.conftest import make_tiny_llama
from tests.test_serve import call, greedy, load, start, stop

WEIGHTS = "adapter_model.safetensors"


def _other_llama(tokenizer, **changes: int) -> LlamaForCausalLM:
    """The tiny Llama's architecture with some sizes changed: the base model of an adapter that does not fit."""
    config = copy.deepcopy(make_tiny_llama(tokenizer).config)
    for key, value in changes.items():
        setattr(config, key, value)
    return LlamaForCausalLM(config).eval()


def _save_trained(lm: LocalLM, name: str, folder: Path, seed: int) -> Path:
    """Adapter ``name`` with random (non-identity) LoRA B weights, saved to ``folder``."""
    view = lm.for_role(name)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, param in lm.hf_model.named_parameters():
            if f"lora_B.{name}." in key:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    lm.backend.mark_updated(name)
    view.save_adapter(folder)
    return folder


def _damage_header(folder: Path) -> None:
    """Halve the first tensor's shape in the safetensors header, keeping every byte count: check_adapter_folder passes
    it (the sizes add up), safetensors refuses it once PEFT has already wrapped the model."""
    path = folder / WEIGHTS
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    first = next(k for k in header if k != "__metadata__")
    header[first]["shape"][-1] //= 2
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    path.write_bytes(data[:8] + text + data[8 + n :])


@pytest.fixture(scope="module")
def folders(smollm_tokenizer, tmp_path_factory) -> dict[str, Path]:
    """Two good adapters of the tiny Llama, and adapters that fail to load onto it in every way we know of."""
    root = tmp_path_factory.mktemp("adapters")
    lm = LocalLM(model=make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer)
    good = {key: _save_trained(lm, key, root / key, seed) for seed, key in ((1, "alpha"), (2, "beta"))}
    lm.backend.batcher.close()
    # well-formed adapters of other base models: wider (every LoRA shape differs), deeper (keys the model lacks)
    wide = LocalLM(model=_other_llama(smollm_tokenizer, hidden_size=48, head_dim=12), tokenizer=smollm_tokenizer)
    deep = LocalLM(model=_other_llama(smollm_tokenizer, num_hidden_layers=4), tokenizer=smollm_tokenizer,
                   lora_config=default_lora_config(None))  # fmt: skip
    bad = {
        "wrong_shape": _save_trained(wide, "x", root / "wrong_shape", 3),
        "extra_layers": _save_trained(deep, "x", root / "extra_layers", 4),
    }
    for other in (wide, deep):
        other.backend.batcher.close()
    for key in ("wrong_modules", "bad_header", "truncated", "empty", "bad_config"):
        bad[key] = root / key
        shutil.copytree(good["alpha"], bad[key])
    config = json.loads((bad["wrong_modules"] / "adapter_config.json").read_text())
    config["target_modules"] = ["no_such_proj"]
    (bad["wrong_modules"] / "adapter_config.json").write_text(json.dumps(config))
    _damage_header(bad["bad_header"])
    weights = (bad["truncated"] / WEIGHTS).read_bytes()
    (bad["truncated"] / WEIGHTS).write_bytes(weights[: len(weights) // 2])
    (bad["empty"] / WEIGHTS).write_bytes(b"")
    (bad["bad_config"] / "adapter_config.json").write_text("{not json")
    return {**good, **bad}


BAD = ["wrong_shape", "extra_layers", "wrong_modules", "bad_header", "truncated", "empty", "bad_config"]


@pytest.fixture
def srv(smollm_tokenizer) -> Iterator[RolecallServer]:
    server = start(LocalLM(model=make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer))
    yield server
    stop(server)


def _model_state(server: RolecallServer) -> tuple[str, list[str], dict[str, bool]]:
    """The model's class, its tensors' names and which of them train: what a failed load must leave unchanged."""
    model = server.backend.model
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    return type(model).__name__, list(model.state_dict()), grads


def _served(server: RolecallServer) -> list[str]:
    return [m["id"] for m in call(server.url, "GET", "/v1/models")[2]["data"]]


def _assert_refused(server: RolecallServer, name: str, folder: Path, **extra: object) -> None:
    status, err = load(server, name, folder, **extra)
    assert status == 400, (folder.name, err)
    message = err["error"]["message"]
    assert str(folder) in message and "PEFT you are using" not in message and "\n" not in message, message


def test_a_failed_first_load_leaves_the_plain_model(srv, folders):
    """No adapter loaded yet: PEFT wraps the model before it finds the weights do not fit; all of that is undone."""
    base = greedy(srv)
    assert load(srv, "ref", folders["alpha"])[0] == 200
    expected = greedy(srv, "ref")
    assert call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "ref"})[0] == 200
    before = _model_state(srv)
    for kind in BAD:
        _assert_refused(srv, "plan", folders[kind])
        assert _served(srv) == [srv.model_name], kind  # no phantom adapter
        status, _, err = call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "plan"})
        assert status == 404, (kind, err)
        assert _model_state(srv) == before, kind
        assert greedy(srv) == base, kind
    assert load(srv, "plan", folders["alpha"])[0] == 200  # the name is free again
    assert greedy(srv, "plan") == expected and greedy(srv) == base
    assert "500" not in call(srv.url, "GET", "/stats")[2]["errors"]


def test_a_failed_load_beside_a_served_adapter_changes_nothing(srv, folders):
    assert load(srv, "critic", folders["beta"])[0] == 200
    critic, base = greedy(srv, "critic"), greedy(srv)
    before = _model_state(srv)
    for kind in BAD:
        _assert_refused(srv, "plan", folders[kind])
        assert _served(srv) == [srv.model_name, "critic"], kind
        assert call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "plan"})[0] == 404, kind
        assert _model_state(srv) == before, kind
        assert greedy(srv, "critic") == critic and greedy(srv) == base, kind
    assert load(srv, "plan", folders["alpha"])[0] == 200
    assert greedy(srv, "critic") == critic


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside-another"])
def test_a_failed_reload_in_place_keeps_the_old_adapter(srv, folders, beside):
    if beside:
        assert load(srv, "critic", folders["beta"])[0] == 200
    assert load(srv, "plan", folders["alpha"])[0] == 200
    old, base = greedy(srv, "plan"), greedy(srv)
    version = call(srv.url, "GET", "/stats")[2]["adapters"]["plan"]
    served = _served(srv)
    before = _model_state(srv)
    for kind in BAD:
        _assert_refused(srv, "plan", folders[kind], load_inplace=True)
        assert _served(srv) == served, kind
        assert greedy(srv, "plan") == old and greedy(srv) == base, kind  # the old weights still answer
        assert call(srv.url, "GET", "/stats")[2]["adapters"]["plan"] == version, kind
        assert _model_state(srv) == before, kind
    # a good reload still replaces it; the version moves on so no prefix cached for the old weights is reused
    assert load(srv, "plan", folders["beta"], load_inplace=True)[0] == 200
    new = greedy(srv, "plan")
    assert new != old and call(srv.url, "GET", "/stats")[2]["adapters"]["plan"] > version
    assert _served(srv) == served
    assert call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "plan"})[0] == 200
    assert load(srv, "plan", folders["alpha"])[0] == 200 and greedy(srv, "plan") == old


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("truncated", f"{WEIGHTS} is damaged"),
        ("empty", f"{WEIGHTS} is damaged"),
        ("bad_config", "adapter_config.json is damaged"),
    ],
)
def test_cli_names_a_damaged_adapter_before_the_model_loads(folders, tmp_path, capsys, kind, fragment):
    """The model path does not exist: had the model been loaded first, its error would be the one printed."""
    missing_model = str(tmp_path / "no-model")
    assert main(["serve", "--model", missing_model, "--adapter", f"plan={folders[kind]}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and str(folders[kind]) in err and "Traceback" not in err, err
    program = tmp_path / "program"  # the same folder inside a saved program (--load)
    shutil.copytree(folders[kind], program / "adapters" / "plan")
    (program / "program.json").write_text(json.dumps({"format_version": 2, "adapters": {"plan": "plan"}}))
    assert main(["serve", "--model", missing_model, "--load", str(program)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err, err


def test_cli_refuses_an_adapter_of_another_base_model_in_one_line(smollm_tokenizer, folders, tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    make_tiny_llama(smollm_tokenizer).save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    args = ["serve", "--model", str(model_dir), "--dtype", "float32", "--port", "0"]
    assert main([*args, "--adapter", f"plan={folders['wrong_shape']}"]) == 1
    err = capsys.readouterr().err  # (after the model's loading progress bars)
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("rolecall serve: error: ") and str(folders["wrong_shape"]) in last, err
    assert "Traceback" not in err and "size mismatch" in last, err
