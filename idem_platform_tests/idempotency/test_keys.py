"""The public keys (idem_platform.idempotency.keys and the caller-key check it re-exports): the spec's minted
key vectors, length prefixes, and caller keys validated."""

from __future__ import annotations

import json
from typing import Any

import pytest

from idem_platform import idempotency
from idem_platform.idempotency import (
    KeyValidationError,
    mint_key,
    minted_key,
    parse_caller_key,
)
from idem_platform_tests.helpers.paths import SPEC_DIR


def _minted_vectors() -> list[dict[str, Any]]:
    # The project's copy of shared/spec/minted_keys.jsonl (test_keys compares it with the original).
    path = SPEC_DIR / "minted_keys.jsonl"
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


@pytest.mark.parametrize("case", _minted_vectors(), ids=lambda c: c["key"][:12])
def test_minted_key_vectors_through_the_library(case: dict[str, Any]) -> None:
    assert idempotency.minted_key(case["parts"]) == case["key"]
    assert mint_key(*case["parts"]) == case["key"]


def test_minted_keys_are_length_prefixed() -> None:
    assert mint_key("ab", "c") != mint_key("a", "bc")
    assert minted_key(iter(["x", "y"])) == mint_key("x", "y")


def test_caller_keys_are_validated() -> None:
    assert parse_caller_key(None) is None
    assert parse_caller_key("  abc  ") == "abc"
    assert parse_caller_key("k" * 255) == "k" * 255
    with pytest.raises(KeyValidationError, match="blank"):
        parse_caller_key(" \t ")
    with pytest.raises(KeyValidationError, match="256 characters"):
        parse_caller_key("k" * 256)
    with pytest.raises(KeyValidationError, match="control character 0x0a at position 1"):
        parse_caller_key("a\nb")
    with pytest.raises(KeyValidationError, match="0x7f"):
        parse_caller_key("a\x7f")
