"""The benchmarks' shared helpers (benchmarks/_common.py) that name run folders."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "_common.py"


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_row_with_many_fields_gets_a_short_folder_name_of_its_own(tmp_path):
    fields_label = _common().fields_label
    many = {f"plan_weights.field_{i}": 0.1 * i for i in range(12)} | {"temperature": 0.8}
    label, slug = fields_label(many)
    assert label.startswith("plan_weights.field_0=0.0,") and len(label) > 255
    assert len(slug) <= 120 and "/" not in slug
    (tmp_path / slug).mkdir()  # the file system takes it
    other = dict(many, temperature=0.9)
    assert fields_label(other)[1] != slug  # the hash keeps two long rows apart
    assert fields_label({"temperature": 0.8}) == ("temperature=0.8", "temperature=0.8")
    assert fields_label({}) == ("", "")
