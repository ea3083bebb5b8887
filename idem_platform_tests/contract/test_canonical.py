"""The canonical form's orjson fast path is byte-identical to the contract's json.dumps, or not taken."""

from __future__ import annotations

import json
import random
import struct

import pytest

from idem_platform.contract.canonical import (
    InvalidJSON,
    canonical_bytes,
    canonical_value_bytes,
    parse_and_canonicalize,
)


def _contract(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _random_float(rng: random.Random) -> float:
    while True:
        roll = rng.random()
        if roll < 0.4:
            value = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        elif roll < 0.8:
            value = rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 300)
        else:
            value = round(rng.uniform(-1e6, 1e6), rng.randint(0, 8))
        if value == value and value not in (float("inf"), float("-inf")):
            return value


def _random_value(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if depth > 2 or roll < 0.25:
        return _random_float(rng)
    if roll < 0.4:
        return rng.choice([0, -1, 2**63 - 1, 2**64 + 5, -(2**70), True, False, None])
    if roll < 0.6:
        alphabet = "ab e-E0.0000\\\"\t\x7f\x00é中😀/xU\x80ÿ€"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    if roll < 0.8:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {
        "".join(rng.choice("abzé_1") for _ in range(rng.randint(1, 4))): _random_value(rng, depth + 1)
        for _ in range(rng.randint(0, 4))
    }


def test_fast_path_matches_the_contract_on_random_records() -> None:
    rng = random.Random(20261122)
    for _ in range(20000):
        record = {"id": "r", "v": _random_value(rng)}
        raw = json.dumps(record, ensure_ascii=rng.random() < 0.5).encode("utf-8")
        value, canonical = parse_and_canonicalize(raw)
        assert canonical == _contract(json.loads(raw)), raw
        assert canonical_value_bytes(value) == _contract(value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"b":1e-07,"a":1E+16}', b'{"a":1e+16,"b":1e-07}'),
        (b'{"x":0.00001}', b'{"x":1e-05}'),
        (b'{"x":12345678901234567890123}', b'{"x":12345678901234567890123}'),
        (b'{"x":"\\u00e9\\ud83d\\ude00"}', b'{"x":"\\u00e9\\ud83d\\ude00"}'),
        (b'{"x":"\x7f"}', b'{"x":"\\u007f"}'),
        (b'{"x":-0.0,"y":1.0}', b'{"x":-0.0,"y":1.0}'),
        # non-ASCII next to backslashes, "x" and "U": the escape must not touch JSON's own escapes
        ('{"x":"\\\\xé\\\\U€ÿ"}'.encode(), b'{"x":"\\\\x\\u00e9\\\\U\\u20ac\\u00ff"}'),
        ('{"x":"é\\\\x41","y":"\\u0080"}'.encode(), b'{"x":"\\u00e9\\\\x41","y":"\\u0080"}'),
        ('{"x":"é😀"}'.encode(), b'{"x":"\\u00e9\\ud83d\\ude00"}'),
    ],
)
def test_known_divergences_take_the_slow_path(raw: bytes, expected: bytes) -> None:
    assert parse_and_canonicalize(raw)[1] == expected


@pytest.mark.parametrize("raw", [b'{"x": NaN}', b'{"x": Infinity}', b'{"x": -Infinity}', b"{", b"\xff\xfe"])
def test_invalid_json_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidJSON):
        parse_and_canonicalize(raw)


def test_canonical_bytes_refuses_nan_floats() -> None:
    with pytest.raises(InvalidJSON):
        canonical_bytes({"x": float("nan")})
