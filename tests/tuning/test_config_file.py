"""Optimizer config files: reading JSON / YAML / TOML, applying fields (nested reward weights too), clear errors on a
bad key, and ``rolecall compile --config``."""

from __future__ import annotations

import json

import pytest

from rolecall.cli import build_parser, main
from rolecall.cli_compile import build_optimizers, check_chain
from rolecall.errors import ConfigError
from rolecall.optimizers import MAPGRPO, SFT, JointGRPO, SPlanRL
from rolecall.tuning.config_file import (
    apply_fields,
    config_sections,
    load_config_file,
    nest,
    with_fields,
    write_config_file,
)


def test_nest_turns_dotted_keys_into_mappings():
    assert nest({"plan_weights.logic": 0.2, "plan_weights": {"execution": 0.4}, "seed": 1}) == {
        "plan_weights": {"logic": 0.2, "execution": 0.4}, "seed": 1}  # fmt: skip
    with pytest.raises(ConfigError, match="also given a value"):
        nest({"seed": 1, "seed.x": 2})


def test_fields_merge_into_nested_reward_weights_and_dict_fields():
    optimizer = with_fields(MAPGRPO(group_size=3), {"plan_weights.logic": 0.2, "plan_weights": {"execution": 0.4},
                                                    "steps": {"plan": 1}, "stages": ["plan"]})  # fmt: skip
    cfg = optimizer.mapgrpo_config
    assert type(optimizer) is MAPGRPO and cfg.group_size == 3  # the template's other fields are kept
    assert (cfg.plan_weights.logic, cfg.plan_weights.execution, cfg.plan_weights.feasibility) == (0.2, 0.4, 0.25)
    assert cfg.steps == {"plan": 1, "analysis": 8, "rewrite": 3, "synthesis": 4} and cfg.stages == ("plan",)
    joint = with_fields(JointGRPO(), {"seed": 4})
    assert type(joint) is JointGRPO and joint.mapgrpo_config.progressive is False and joint.config.seed == 4
    warm = SFT(epochs=1)
    assert with_fields(MAPGRPO(warm_start=warm), {}).warm_start is warm  # constructor extras are carried over
    assert with_fields(SPlanRL(), {"alpha": 0.3}).splanrl_config.weights.alpha == 0.3


@pytest.mark.parametrize("fields, message", [
    ({"learnin_rate": 1e-3}, "SFTConfig has no field 'learnin_rate'; valid fields are: .*learning_rate"),
    ({"learning_rate": -1.0}, "learning_rate must be a float in"),
])  # fmt: skip
def test_a_bad_key_or_value_names_it(fields, message):
    with pytest.raises(ConfigError, match=message):
        with_fields(SFT(), fields)


def test_a_bad_nested_key_names_its_path_and_the_valid_ones():
    with pytest.raises(ConfigError, match=r"PlanRewardWeights has no field 'plan_weights.logc'; valid fields are: "
                                          r"logic, feasibility, execution, efficiency, placeholder"):  # fmt: skip
        apply_fields(MAPGRPO().mapgrpo_config, {"plan_weights": {"logc": 0.1}})


@pytest.mark.parametrize("suffix, text", [
    (".json", '{"sft": {"learning_rate": 0.001, "epochs": 1.5}}'),
    (".yaml", "sft:\n  learning_rate: 0.001\n  epochs: 1.5\n"),
    (".toml", "[sft]\nlearning_rate = 0.001\nepochs = 1.5\n"),
])  # fmt: skip
def test_json_yaml_and_toml_files_read_the_same(tmp_path, suffix, text):
    path = tmp_path / f"config{suffix}"
    path.write_text(text)
    assert config_sections(load_config_file(path), ["sft"]) == {"sft": {"learning_rate": 0.001, "epochs": 1.5}}


def test_sections_flat_files_and_their_errors(tmp_path):
    assert config_sections({"learning_rate": 0.1}, ["sft"]) == {"sft": {"learning_rate": 0.1}}
    assert config_sections({"mapgrpo.group_size": 3}, ["sft", "mapgrpo"]) == {"mapgrpo": {"group_size": 3}}
    with pytest.raises(ConfigError, match="group the config fields under the optimizer names"):
        config_sections({"learning_rate": 0.1}, ["sft", "mapgrpo"])
    with pytest.raises(ConfigError, match="'opd' is not an optimizer of the chain; valid sections are: sft, mapgrpo"):
        config_sections({"sft": {}, "opd": {}}, ["sft", "mapgrpo"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="does not parse as JSON"):
        load_config_file(bad)
    (tmp_path / "c.ini").write_text("[sft]\n")
    with pytest.raises(ConfigError, match="unknown format '.ini'"):
        load_config_file(tmp_path / "c.ini")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_file(tmp_path / "missing.json")


def _compile_args(*extra: str):
    return build_parser().parse_args(["compile", "--program", "opera", "--out", "runs/x", *extra])


def test_compile_config_overrides_the_defaults_and_the_flags(tmp_path):
    config = write_config_file(tmp_path / "best.json", {
        "sft": {"learning_rate": 0.001, "epochs": 1.5},
        "mapgrpo": {"plan_weights": {"logic": 0.1, "execution": 0.5}, "group_size": 3}})  # fmt: skip
    args = _compile_args("--optimizer", "sft,mapgrpo", "--sft.learning-rate", "0.005", "--config", str(config))
    sft, mapgrpo = build_optimizers(args, *check_chain(args))
    assert (sft.sft_config.learning_rate, sft.sft_config.epochs, sft.sft_config.micro_batch_size) == (0.001, 1.5, 2)
    cfg = mapgrpo.mapgrpo_config
    assert (cfg.plan_weights.logic, cfg.plan_weights.execution, cfg.group_size) == (0.1, 0.5, 3)
    assert str(cfg.output_dir) == "runs/x/mapgrpo"  # what the file leaves out still comes from the flags


def test_compile_config_with_a_bad_key_fails_in_one_line_before_loading(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    config = tmp_path / "best.json"
    config.write_text(json.dumps({"learning_rat": 0.001}))
    assert main(["compile", "--program", "opera", "--config", str(config), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "rolecall compile: error: SFTConfig has no field 'learning_rat'; valid fields are: " in err
    assert "learning_rate" in err and "Traceback" not in err
