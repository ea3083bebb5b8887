"""Effects built in Python: the models ``idem_platform`` exports, and the documented example
of docs/effects.md ("In Python") run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import idem_platform
from idem_platform.config.effects import EffectConfig, HttpDelivery
from idem_platform_tests.helpers.paths import REPO

_PYTHON = re.compile(r"^## In Python\n.*?```python\n(.*?)```", re.S | re.M)


def test_the_effect_models_are_exported_from_the_package() -> None:
    assert idem_platform.Effect is EffectConfig and idem_platform.HttpDelivery is HttpDelivery
    assert {"Effect", "Condition", "HttpDelivery", "PythonDelivery", "IdemConfig"} <= set(dir(idem_platform))


def test_the_documented_python_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = _PYTHON.search((REPO / "docs" / "effects.md").read_text(encoding="utf-8"))
    assert found is not None, "docs/effects.md has no python block under '## In Python'"
    monkeypatch.setenv("SOAR_TOKEN", "doc-token")  # as test_docs gives the YAML examples
    monkeypatch.chdir(tmp_path)
    (tmp_path / "drop" / "threatfeed").mkdir(parents=True)
    namespace: dict[str, object] = {}
    exec(compile(found.group(1), "docs/effects.md", "exec"), namespace)  # noqa: S102 - our own documented example
    config = namespace["config"]
    assert isinstance(config, idem_platform.IdemConfig)
    assert [effect.name for effect in config.effects] == ["soar-alert"]
