"""Direct rows are COPYed in idempotency-key order, without the rows the table holds."""

from __future__ import annotations

import pytest

from idem_platform.coercion import native
from idem_platform.write.staging import in_key_order


def _rows(*pieces: bytes) -> tuple[bytes, list[int]]:
    data = b"".join(pieces)
    ends, end = [], 0
    for piece in pieces:
        end += len(piece)
        ends.append(end)
    return data, ends


def test_rows_come_out_sorted_by_key_each_tuple_whole() -> None:
    data, ends = _rows(b"ccc", b"a", b"bb", b"dddd")
    out, count = in_key_order(data, ends, ["k3", "k1", "k2", "k0"], set())
    assert (out, count) == (b"dddd" + b"a" + b"bb" + b"ccc", 4)


def test_held_rows_are_left_out_by_their_one_based_position() -> None:
    data, ends = _rows(b"ccc", b"a", b"bb", b"dddd")
    out, count = in_key_order(data, ends, ["k3", "k1", "k2", "k0"], {1, 4})
    assert (out, count) == (b"a" + b"bb", 2)


def test_keys_compare_bytewise_like_the_primary_keys_collation() -> None:
    data, ends = _rows(b"lower", b"upper", b"digit")
    out, _ = in_key_order(data, ends, ["a", "B", "9"], set())
    assert out == b"digit" + b"upper" + b"lower"  # "9" < "B" < "a", as COLLATE "C" orders them


def test_nothing_left_is_empty() -> None:
    data, ends = _rows(b"x")
    assert in_key_order(data, ends, ["k"], {1}) == (b"", 0)


@pytest.mark.parametrize("native_path", ["1", "0"])
def test_both_paths_give_the_same_bytes(native_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C gather and the Python join agree, held rows and empty pieces included."""
    monkeypatch.setenv("IDEM_NATIVE", native_path)
    pieces = [bytes([65 + i % 26]) * (i % 7) for i in range(200)]
    data, ends = _rows(*pieces)
    keys = [f"k{(i * 37) % 200:03d}" for i in range(200)]
    out, count = in_key_order(bytearray(data), ends, keys, {3, 50, 200})
    kept = sorted((i for i in range(200) if i + 1 not in {3, 50, 200}), key=keys.__getitem__)
    assert (out, count) == (b"".join(pieces[i] for i in kept), 197)


@pytest.mark.skipif(not native.AVAILABLE, reason="the C extension is not built")
def test_the_c_gather_refuses_pieces_outside_the_data() -> None:
    """A wrong index or end is an error naming it, never a read past the buffer."""
    with pytest.raises(IndexError, match="order\\[0\\] = 2"):
        native.gather(b"abc", [1, 3], [2])
    with pytest.raises(ValueError, match="spans \\[1, 9\\) of 3 bytes"):
        native.gather(b"abc", [1, 9], [1])
