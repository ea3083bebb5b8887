"""Reading ``idem.yaml``: YAML with no repeated keys, ``${VAR}`` substitution, relative paths,
and validation errors turned into one line per problem naming the key and its line."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from idem_platform.config.connectors import KINDS, KafkaConnector
from idem_platform.config.model import IdemConfig
from idem_platform.errors import ConfigError
from idem_platform.redact import remember_secrets, remember_settings
from idem_platform.settings import CONFIG_ENV, config_path_from_environment

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _resolve_env(value: Any, where: str, path: str, found: set[str] | None = None) -> Any:
    """``value`` with every ``${VAR}`` replaced; ``found`` gains the values read from the environment."""
    if isinstance(value, dict):
        return {k: _resolve_env(v, f"{where}.{k}" if where else str(k), path, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env(v, f"{where}[{i}]", path, found) for i, v in enumerate(value)]
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                if found is not None:
                    found.add(os.environ[name])
                return os.environ[name]
            if default is not None:
                return default
            raise ConfigError(f"environment variable {name} is not set", path=path, key=where)

        return _ENV_REF.sub(substitute, value)
    return value


def _header_secrets(data: dict[str, Any], where: str) -> set[str]:
    """The environment's values that ``effects[*].http.headers`` take through ``${VAR}``."""
    found: set[str] = set()
    effects = data.get("effects")
    for index, effect in enumerate(effects if isinstance(effects, list) else []):
        http = effect.get("http") if isinstance(effect, dict) else None
        headers = http.get("headers") if isinstance(http, dict) else None
        if isinstance(headers, dict):
            _resolve_env(headers, f"effects[{index}].http.headers", where, found)
    return {value for value in found if value}


def _line_of(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line of the YAML node at ``loc`` (or its nearest parent)."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            nxt = node.value[part]
        else:
            nxt = None
        if nxt is None:
            break
        node = nxt
        line = node.start_mark.line + 1
    return line


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problem(error: ErrorDetails, root: yaml.Node | None) -> str:
    """One validation error as ``key (line N): message``, in the file's own terms.

    A connector is validated as the model its ``kind`` names, and pydantic puts that kind in
    the error's location (``connectors[0].kafka.topics``) and words a bad or missing ``kind``
    in terms of tags: both are put back as a key of the file (``connectors[0].kind``)."""
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    message = error["msg"].removeprefix("Value error, ")
    if len(loc) > 2 and loc[0] == "connectors" and isinstance(loc[1], int) and loc[2] in KINDS:
        loc = loc[:2] + loc[3:]
    if error["type"] == "union_tag_invalid":
        loc, message = (*loc, "kind"), f"Input should be {_one_of(KINDS)}"
    elif error["type"] == "union_tag_not_found":
        loc, message = (*loc, "kind"), "Field required"
    elif error["type"] == "model_attributes_type" and loc[:1] == ("connectors",):
        message = "Input should be a valid dictionary or instance of ConnectorConfig"
    line = _line_of(root, loc)
    return f"{_dotted(loc) or '(top level)'}{f' (line {line})' if line else ''}: {message}"


def _one_of(values: tuple[str, ...]) -> str:
    """``'a', 'b' or 'c'``, as pydantic words a choice."""
    quoted = [repr(value) for value in values]
    return ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else quoted[0]


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (the last would win silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_config(text: str, path: Path | None = None) -> IdemConfig:
    """Parse the text of an ``idem.yaml``.

    Raises:
        ConfigError: for YAML syntax, unknown keys, wrong types, bad names, unset
            environment variables and dangling references; the message names the
            file, the key and its line.
    """
    where = str(path) if path else "idem.yaml"
    try:
        root = yaml.compose(text)
        data = yaml.load(text, Loader=_UniqueKeyLoader) or {}  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"not valid YAML{at}: {exc.problem or exc.context}", path=where) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {str(exc).splitlines()[0]}", path=where) from None
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping (connectors:, tables:, ...)", path=where)
    secrets = _header_secrets(data, where)
    data = _resolve_env(data, "", where)
    base = path.parent if path else Path.cwd()
    connectors = data.get("connectors")
    for connector in connectors if isinstance(connectors, list) else []:
        if isinstance(connector, dict) and isinstance(connector.get("path"), str):
            connector["path"] = str((base / connector["path"]).resolve())
    try:
        config = IdemConfig.model_validate(data, context={"source": path})
    except ValidationError as exc:
        raise ConfigError("; ".join(_problem(error, root) for error in exc.errors()), path=where) from None
    for connector in config.connectors:
        if isinstance(connector, KafkaConnector):
            # From here on, no message of this process shows these credentials (idem_platform.redact).
            remember_settings(connector.client_config)
    remember_secrets(secrets)  # an effect's ${VAR} headers (an API token): masked from here on
    return config.model_copy(update={"source": path})


def load_config(path: str | Path | None = None) -> IdemConfig:
    """Load ``idem.yaml`` from ``path``, else ``$IDEM_CONFIG``, else ``./idem.yaml``.

    Raises:
        ConfigError: the file is missing or invalid.
    """
    chosen = path or config_path_from_environment() or "idem.yaml"
    resolved = Path(chosen).expanduser().resolve()
    if not resolved.is_file():
        raise ConfigError(
            f"config file not found: {resolved} (pass --config PATH or set {CONFIG_ENV})"
        )
    try:
        text = resolved.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})", path=str(resolved)) from None

    return parse_config(text, resolved)
