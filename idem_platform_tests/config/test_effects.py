"""``effects:`` in idem.yaml (idem_platform.config.effects): what loads, what the connectors
carry, and every mistake refused at load with the key at fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from idem_platform.config import parse_config
from idem_platform.errors import ConfigError
from idem_platform.redact import scrub
from idem_platform_tests.helpers.config import BASE

EFFECT = """
effects:
  - name: alert
    record_type: thing
    when: {field: score, gte: 80}
    http:
      url: https://soar.example/alerts
      headers: {Authorization: "Bearer ${IDEM_TEST_SOAR_TOKEN}"}
      body: {what: name, id: external_id}
"""


def _with(**changes: object) -> str:
    data = yaml.safe_load(BASE + "      score: int\n      active: bool\n" + EFFECT)
    data["effects"][0].update(changes)
    return yaml.safe_dump(data)


def test_an_effect_loads_with_its_defaults_and_the_connector_carries_its_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEM_TEST_SOAR_TOKEN", "tok-9f2c81")
    config = parse_config(_with())
    (effect,) = config.effects
    assert (effect.max_attempts, effect.http.method, effect.http.timeout_seconds) == (5, "POST", 10.0)
    assert effect.key is None and effect.key_parts(upsert=False) == ("effect", "connector", "record_type", "external_id", "content_hash")
    (rule,) = config.connector("feed").effects
    assert rule.when == (("score", "gte", 80),) and rule.body == (("id", "external_id"), ("what", "name"))
    assert rule.key == effect.key_parts(upsert=False) and rule.on_change == ()
    assert "tok-9f2c81" not in repr(rule)  # no header travels with a commit's plan
    assert scrub("sent Bearer tok-9f2c81") == "sent Bearer ***"  # masked in every later message


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"when": {"field": "score", "gte": "high"}}, "when: 'high' is not a int value (column 'score')"),
        ({"when": {"field": "nope", "equals": 1}}, "when: 'nope' is not a declared column"),
        ({"when": {"field": "active", "gt": True}}, "'active' is a bool column: use equals, not_equals or in"),
        ({"when": {"field": "score", "gte": 1, "lte": 9}}, "exactly one of equals, not_equals, in, gt, gte, lt, lte"),
        ({"when": {"field": "score", "in": []}}, "'in' needs at least one value"),
        ({"record_type": "other"}, "record_type 'other' is not in tables (thing)"),
        ({"key": ["connector", "external_id"]}, "key must include 'effect'"),
        ({"key": ["effect", "colour"]}, "key part 'colour' is neither a column of thing"),
        ({"python": {"function": "json:dumps", "body": {"id": "external_id"}}}, "exactly one of http: (a request) and python:"),
        ({"results_table": "thing"}, "results_table 'thing' is the table of record type 'thing'"),
        ({"results_table": "outbox"}, "results_table 'outbox' is one of idem's own tables"),
        ({"results_table": "Bad-Name"}, "effects[0].results_table"),
        ({"lease_seconds": 5}, "lease_seconds (5) must be longer than http.timeout_seconds (10)"),
        ({"max_attempts": 0}, "effects[0].max_attempts"),
        ({"name": "Bad Name"}, "effects[0].name"),
        ({"retries": 3}, "effects[0].retries"),
    ],
)
def test_a_mistake_is_one_config_error_naming_it(
    changes: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEM_TEST_SOAR_TOKEN", "tok-5e1d0c")  # remembered as a secret: never a common text
    with pytest.raises(ConfigError) as raised:
        parse_config(_with(**changes))
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("http", "message"),
    [
        ({"body": {"what": "colour"}}, "http.body.what: 'colour' is neither a column of thing"),
        ({"body": {}}, "effects[0].http.body"),
        ({"url": "ftp://x"}, "effects[0].http.url"),
        ({"method": "GET"}, "effects[0].http.method"),
        ({"headers": {"Idempotency-Key": "k"}}, "header 'Idempotency-Key' is set by idem"),
        ({"headers": {"Content-Length": "3"}}, "header 'Content-Length' is set by idem"),
    ],
)
def test_a_mistake_in_the_request_is_refused(http: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEM_TEST_SOAR_TOKEN", "tok-5e1d0c")  # remembered as a secret: never a common text
    data = yaml.safe_load(_with())
    data["effects"][0]["http"].update(http)
    with pytest.raises(ConfigError) as raised:
        parse_config(yaml.safe_dump(data))
    assert message in str(raised.value)


def test_content_type_may_be_set_to_push_ndjson(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEM_TEST_SOAR_TOKEN", "tok-5e1d0c")  # remembered as a secret: never a common text
    data = yaml.safe_load(_with())
    data["effects"][0]["http"]["headers"]["Content-Type"] = "application/x-ndjson"
    http = parse_config(yaml.safe_dump(data)).effects[0].http
    assert http is not None and http.headers["Content-Type"] == "application/x-ndjson"


def test_an_unset_secret_and_a_twice_used_name_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IDEM_TEST_SOAR_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="environment variable IDEM_TEST_SOAR_TOKEN is not set"):
        parse_config(_with())
    monkeypatch.setenv("IDEM_TEST_SOAR_TOKEN", "tok-5e1d0c")  # remembered as a secret: never a common text
    data = yaml.safe_load(_with())
    data["effects"].append(dict(data["effects"][0]))
    with pytest.raises(ConfigError, match="effect name 'alert' is used twice"):
        parse_config(yaml.safe_dump(data))


def _function_config(tmp_path: Path, function: str, modules: list[str]) -> Path:
    """The base config with a function effect ``function``, its ``effect_modules``, and a module
    ``fx_cfg_effects`` beside the file (the config's directory is on the import path)."""
    (tmp_path / "fx_cfg_effects.py").write_text("def act(payload, key):\n    return {'ok': True}\nNOT_A_FUNCTION = 3\n")
    data = yaml.safe_load(_with())
    del data["effects"][0]["http"]
    data["effects"][0]["python"] = {"function": function, "body": {"what": "name", "id": "external_id"}}
    data["effect_modules"] = modules
    path = tmp_path / "idem.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_function_effect_loads_from_a_listed_module(tmp_path: Path) -> None:
    path = _function_config(tmp_path, "fx_cfg_effects:act", ["fx_cfg_effects"])
    config = parse_config(path.read_text(), path)
    (effect,) = config.effects
    assert effect.http is None and effect.python is not None
    assert effect.python.resolve()({"what": "x"}, "k") == {"ok": True}
    (rule,) = config.connector("feed").effects
    assert rule.body == (("id", "external_id"), ("what", "name")) and rule.warn_pending_after_seconds == 3600


@pytest.mark.parametrize(
    ("function", "modules", "message"),
    [
        ("fx_cfg_effects:act", [], "module 'fx_cfg_effects' is not listed in effect_modules (none)"),
        ("fx_cfg_effects:missing", ["fx_cfg_effects"], "'fx_cfg_effects' has no function 'missing'"),
        ("fx_cfg_effects:NOT_A_FUNCTION", ["fx_cfg_effects"], "has no function 'NOT_A_FUNCTION'"),
        ("fx_cfg_nowhere:act", ["fx_cfg_nowhere"], "module 'fx_cfg_nowhere' cannot be imported (ModuleNotFoundError"),
        ("not a function", ["fx_cfg_effects"], "effects[0].python.function"),
    ],
)
def test_a_function_that_cannot_be_called_is_refused_at_load(
    tmp_path: Path, function: str, modules: list[str], message: str
) -> None:
    path = _function_config(tmp_path, function, modules)
    with pytest.raises(ConfigError) as raised:
        parse_config(path.read_text(), path)
    assert message in str(raised.value)


def test_a_results_table_loads_and_two_effects_may_not_share_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEM_TEST_SOAR_TOKEN", "tok-5e1d0c")  # remembered as a secret: never a common text
    (effect,) = parse_config(_with(results_table="alert_answers")).effects
    assert effect.results_table == "alert_answers"
    data = yaml.safe_load(_with(results_table="alert_answers"))
    data["effects"].append({**data["effects"][0], "name": "alert-2"})
    with pytest.raises(ConfigError, match="results_table 'alert_answers' is the results table of effect 'alert'"):
        parse_config(yaml.safe_dump(data))
