"""Keys (DESIGN §2): every vector of shared/spec/ reproduced exactly, plus the edge rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idem_platform.contract.canonical import parse_and_canonicalize
from idem_platform.contract.keys import (
    ext_id_text,
    file_key,
    file_position,
    kafka_position,
    minted_key,
    parse_caller_key,
    record_key,
    record_key_of,
    record_keys,
)
from idem_platform.errors import KeyValidationError
from idem_platform_tests.helpers.paths import SPEC_DIR, shared_spec_dir


def _vectors(name: str) -> list[dict]:
    path = SPEC_DIR / name
    assert path.is_file(), f"spec vectors missing at {path}"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


IDEMPOTENCY = _vectors("idempotency_keys.jsonl")
FILEDROP = _vectors("filedrop_keys.jsonl")
MINTED = _vectors("minted_keys.jsonl")


@pytest.mark.parametrize("name", ["idempotency_keys.jsonl", "filedrop_keys.jsonl", "minted_keys.jsonl"])
def test_the_copied_vectors_are_the_shared_spec(name: str) -> None:
    """The project carries its own copy; where the design's shared spec sits beside the
    checkout, the copy must be byte-identical to it."""
    shared = shared_spec_dir()
    if shared is None or not (shared / name).is_file():
        pytest.skip("no shared spec beside this checkout: the project's own copy is what the tests use")
    assert (SPEC_DIR / name).read_bytes() == (shared / name).read_bytes()


def _raw_line(record: dict) -> bytes:
    # The record as a producer would send it: insertion order, non-ASCII raw.
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("case", IDEMPOTENCY, ids=lambda c: c["key"])
def test_record_key_vectors(case: dict) -> None:
    _, canonical = parse_and_canonicalize(_raw_line(case["record"]))
    assert canonical.decode("utf-8") == case["canonical"]
    assert record_key_of(case["connector"], case["type"], case["ext_id"], canonical) == case["key"]


def test_vectors_cover_the_documented_cases() -> None:
    # Lines 1-2: same record, other key order, same key; line 3 one value changed.
    assert IDEMPOTENCY[0]["key"] == IDEMPOTENCY[1]["key"] != IDEMPOTENCY[2]["key"]
    assert len(IDEMPOTENCY) == 9 and len(FILEDROP) == 4 and len(MINTED) == 6


@pytest.mark.parametrize("case", FILEDROP, ids=lambda c: c["key"][-12:])
def test_file_key_vectors(case: dict, tmp_path: Path) -> None:
    data = bytes.fromhex(case["bytes_hex"])
    assert file_key(data) == case["key"]
    # The chunked hash of a dropped file agrees with the one-shot hash.
    from idem_platform.sources.filedrop.files import hash_file

    path = tmp_path / "drop.ndjson"
    path.write_bytes(data)
    assert hash_file(path, chunk_bytes=3).key == case["key"]


@pytest.mark.parametrize("case", MINTED, ids=lambda c: c["key"][:12])
def test_minted_key_vectors(case: dict) -> None:
    assert minted_key(case["parts"]) == case["key"]


def test_ext_id_text_rules() -> None:
    assert ext_id_text("ioc-1") == "ioc-1"
    assert ext_id_text(7) == "7"
    assert ext_id_text(1.0) == "1.0"
    assert ext_id_text(True) == "true"
    assert ext_id_text(None) is None
    with pytest.raises(TypeError, match="object"):
        ext_id_text({"a": 1})
    with pytest.raises(TypeError, match="array"):
        ext_id_text([1])


def test_unsafe_or_long_ext_id_is_hashed_deterministically() -> None:
    digest = "93bea2b25b36" + "0" * 28
    with_control = record_key("c", "t", "a\tb", digest)
    assert with_control == record_key("c", "t", "a\tb", digest)
    assert with_control.startswith("c:t:sha1~") and "\t" not in with_control
    long_key = record_key("c", "t", "x" * 300, digest)
    assert len(long_key) <= 255 and long_key.startswith("c:t:sha1~")
    assert record_key("c", "t", "x" * 200, digest) == "c:t:" + "x" * 200 + ":93bea2b25b36"


def test_positions_include_the_source_identity() -> None:
    assert file_position("ab" * 32, 12) == "abababababababab#L12"
    assert kafka_position("events", 3, 42) == "events-3@42"


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), ("  key-1 ", "key-1"), ("k" * 255, "k" * 255)],
)
def test_caller_key_accepted(header: str | None, expected: str | None) -> None:
    assert parse_caller_key(header) == expected


@pytest.mark.parametrize(
    ("header", "message"),
    [("   ", "blank"), ("k" * 256, "256 characters"), ("a\x01b", "0x01"), ("a\x7fb", "0x7f")],
)
def test_caller_key_rejected(header: str, message: str) -> None:
    with pytest.raises(KeyValidationError, match=message):
        parse_caller_key(header)


_EXT_IDS = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),  # the common, plain ids
    st.text(max_size=300),  # any text: control characters, non-ASCII, surrogates, too long
    st.sampled_from(["a\x7fb", "\x00", "é", "x" * 228, "x" * 229, "\ud800"]),
)


@settings(max_examples=300, deadline=None)
@given(
    batch=st.lists(
        st.tuples(
            st.sampled_from(["indicator", "malware", "threat-actor", "t" * 64]), _EXT_IDS,
            st.text(alphabet="0123456789abcdef", min_size=12, max_size=40),
        ),
        max_size=20,
    ),
    connector=st.sampled_from(["feed", "c" * 64]),
)
def test_record_keys_are_record_key_of_each(batch: list[tuple[str, str, str]], connector: str) -> None:
    """The batch form builds every key byte for byte as record_key does, whichever ids a
    batch mixes (a batch with one id to hash hashes that one only)."""
    types, ids, digests = [list(column) for column in zip(*batch, strict=True)] if batch else ([], [], [])
    assert record_keys(connector, types, ids, digests) == [
        record_key(connector, t, e, d) for t, e, d in batch
    ]
