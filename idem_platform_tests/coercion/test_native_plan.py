"""The C path's plans (``native.ScanPlan``, ``LineFacts``, ``DirectWrite``) are checked attribute by attribute.

``_native.scan_lines`` and ``_native.write_direct`` read their plans by attribute name; a
wrong or incomplete plan must be a Python ``TypeError`` or ``ValueError`` naming the bad
attribute, never a crash of the worker (a positional tuple read unchecked in C segfaulted
on a 2-item route).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from idem_platform.coercion import native

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="the C extension is not built")

LINE = b'{"type":"t","id":"a","name":"n"}'


def _layout() -> native.DirectLayout:
    return native.DirectLayout(fields={"name": 0, "id": -1, "type": -1}, kinds=b"s", required=b"\x01", dims=(0,), emitted=1)


def _scan(**changes: Any) -> native.ScanPlan:
    plan = native.ScanPlan(
        shallow=frozenset(), layouts=None, fixed_type=None, type_field="type", id_field="id",
        version_field="schema_version",
    )
    return replace(plan, **changes)


def _facts() -> native.LineFacts:
    return native.LineFacts(bytearray(), [], [], [], [], [])


def _write(facts: native.LineFacts, **changes: Any) -> native.DirectWrite:
    n = len(facts.kinds)
    plan = native.DirectWrite(
        lines=list(range(n)), keys=["c:t:a:x"] * n, ids=facts.ids, digests=facts.digests, tails=facts.tails,
        raws=[LINE] * n, pos=bytes(8 * n), offsets=bytes(8 * n), units=bytes(8 * n), prefixes=[b"f#L"], emitted=1,
        rows=bytearray(), ends=[],
    )
    return replace(plan, **changes)


def _run(plan: Any, facts: Any = None, raws: list[Any] | None = None) -> None:
    assert native._scan_lines is not None
    native._scan_lines([LINE] if raws is None else raws, plan, _facts() if facts is None else facts)


def _direct_facts() -> native.LineFacts:
    facts = _facts()
    _run(_scan(layouts={"t": _layout()}), facts)
    return facts


def test_a_good_plan_finds_the_facts() -> None:
    facts = _facts()
    _run(_scan(), facts)
    assert facts.kinds == bytearray([1]) and facts.records == [{"type": "t", "id": "a", "name": "n"}]
    direct = _direct_facts()
    assert direct.kinds == bytearray([2]) and direct.types == ["t"] and direct.ids == ["a"]
    assert direct.digests == facts.digests and direct.records == [None]
    write = _write(direct)
    assert native._write_direct is not None
    native._write_direct(write)
    assert len(write.ends) == 1 and write.ends[0] == len(write.rows) and b"c:t:a:x" in write.rows


def _write_run(plan: Any) -> None:
    assert native._write_direct is not None
    native._write_direct(plan)


BAD_PLANS: list[tuple[str, Any, type[Exception], str]] = [
    ("not a plan", (object(), None), TypeError, r"ScanPlan\.shallow is missing"),
    ("2-item layout", (_scan(layouts={"t": ([], [])}), None), TypeError, r"ScanPlan\.layouts\['t'\]\.fields is missing"),
    ("layout type", (_scan(layouts=[_layout()]), None), TypeError, r"ScanPlan\.layouts must be dict or None"),
    ("shallow type", (_scan(shallow={"a"}), None), TypeError, r"\.shallow must be frozenset"),
    ("facts type", (_scan(), SimpleNamespace(kinds=bytearray(), records=())), TypeError, r"LineFacts\.records must be list, not tuple"),
    ("incomplete facts", (_scan(), SimpleNamespace(kinds=bytearray())), TypeError, r"LineFacts\.records is missing"),
    ("no routing", (_scan(type_field=None), None), ValueError, r"fixed_type and type_field are both None"),
    ("kinds length", (_scan(layouts={"t": replace(_layout(), kinds=b"ss")}), None), ValueError, r"one entry per column"),
    ("kind letter", (_scan(layouts={"t": replace(_layout(), kinds=b"x")}), None), ValueError, r"kinds\[0\]"),
    ("emitted", (_scan(layouts={"t": replace(_layout(), emitted=3)}), None), ValueError, r"emitted is 3"),
    ("field index", (_scan(layouts={"t": replace(_layout(), fields={"name": 7})}), None), ValueError, r"fields"),
    ("dims", (_scan(layouts={"t": replace(_layout(), dims=("3",))}), None), ValueError, r"dims\[0\]"),
    ("write: not a plan", (object(),), TypeError, r"DirectWrite\.raws is missing"),
    ("write: lines", (_write(_direct_facts(), pos=bytes(16)),), ValueError, r"one int64 per line"),
    ("write: keys", (_write(_direct_facts(), keys=[]),), ValueError, r"one key per line written"),
    ("write: line", (_write(_direct_facts(), lines=[5]),), ValueError, r"lines\[0\]: not a line"),
    ("write: no facts", (_write(_facts(), raws=[LINE], ids=[None], digests=[None], tails=[None], lines=[0], keys=["k"],
                                pos=bytes(8), offsets=bytes(8), units=bytes(8)),), ValueError, r"no direct facts"),
    ("write: prefix", (_write(_direct_facts(), prefixes=["f#L"]),), ValueError, r"no direct facts \(or its unit no prefix\)"),
    ("write: per line", (_write(_direct_facts(), ids=[]),), ValueError, r"DirectWrite\.ids needs one entry per line"),
]


def _call(args: tuple[Any, ...]) -> None:
    if len(args) == 1:
        _write_run(args[0])
    else:
        _run(*args)


@pytest.mark.parametrize(("args", "error", "message"), [case[1:] for case in BAD_PLANS], ids=[case[0] for case in BAD_PLANS])
def test_a_bad_plan_is_an_exception_naming_the_attribute(args: tuple[Any, ...], error: type[Exception], message: str) -> None:
    facts = args[1] if len(args) == 2 and isinstance(args[1], native.LineFacts) else None
    with pytest.raises(error, match=message):
        _call(args)
    if facts is not None:
        assert facts.kinds == bytearray() and facts.records == []  # nothing appended before the plan was checked


def test_a_bad_plan_does_not_crash_the_process() -> None:
    """A worker given a 2-item layout (what segfaulted the positional tuple) lives on."""
    code = textwrap.dedent(
        """
        from idem_platform_tests.coercion.test_native_plan import BAD_PLANS, _call
        for name, args, error, _ in BAD_PLANS:
            try:
                _call(args)
            except error:
                continue
            raise SystemExit(f"{name}: no {error.__name__}")
        print("survived")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "survived"
