"""Direct rows are COPYed in idempotency-key order, without the rows the table holds."""

from __future__ import annotations

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
