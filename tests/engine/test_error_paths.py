"""Container errors name the file's path, not its bare name (issue 11, minor): with several
containers on one machine, "manifest.json: ..." does not say which one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.engine.native import try_open


@pytest.fixture()
def model(synthetic_f32, tmp_path) -> Path:
    dst = tmp_path / "m.waste"
    shutil.copytree(synthetic_f32, dst)
    return dst


def test_a_manifest_error_names_the_path(model):
    manifest = json.loads((model / "manifest.json").read_text())
    manifest["format_version"] = 999
    (model / "manifest.json").write_text(json.dumps(manifest))
    status, detail, _ = try_open(model)
    assert status == "E_FORMAT"
    assert detail.startswith(f"{model}/manifest.json: format_version 999"), detail


def test_a_trunk_error_names_the_path(model):
    trunk = model / "trunk.bin"
    trunk.write_bytes(trunk.read_bytes()[:100])
    status, detail, _ = try_open(model)
    assert status == "E_FORMAT"
    assert detail.startswith(f"{model}/trunk.bin: tensor "), detail
