"""The C path's plan (``native.BatchPlan`` and its parts) is checked attribute by attribute.

``_native.coerce_lines`` reads the plan by attribute name; a wrong or incomplete plan
must be a Python ``TypeError`` or ``ValueError`` naming the bad attribute, never a crash
of the worker (a positional tuple read unchecked in C segfaulted on a 2-item route).
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


def _route() -> native.RoutePlan:
    return native.RoutePlan(rows=[], records=[], known=frozenset({"type", "id", "name"}), current=1, table=None)


def _direct_route() -> native.DirectRoute:
    return native.DirectRoute(
        fields={"name": 0, "id": -1, "type": -1}, kinds=b"s", required=b"\x01", dims=(0,), emitted=1,
        drop_unknown=False, rows=bytearray(), keys=[], ends=[],
    )


def _direct(lines: int = 1) -> native.DirectPlan:
    zeros = bytes(8 * lines)
    return native.DirectPlan(
        routes={"t": _direct_route()}, pos=zeros, offsets=zeros, units=zeros, prefixes=[b"f#L"],
        type_field="type", id_field="id", version_field="schema_version",
    )


def _plan(**changes: Any) -> native.BatchPlan:
    declined: list[int] = []
    plan = native.BatchPlan(
        out_input=[], out_type=[], out_key=[], out_ext=[], out_hash=[], out_payload=[], out_extra=[], out_props=[],
        out_errors=[], routes={"t": _route()}, fixed_type=None, type_field="type", id_field="id", connector="c",
        version_field="schema_version", declared=None, shallow=frozenset(), too_long=set(), max_key=512,
        seen_lines=None, seen_keys=None, skipped=None, fresh=None, in_batch=[],
        on_unknown=lambda table, record, record_type: (None, None), decline=declined.append, direct=None,
    )
    return replace(plan, **changes)


def _run(plan: Any, raws: list[Any] | None = None) -> None:
    assert native._coerce_lines is not None
    native._coerce_lines([LINE] if raws is None else raws, plan)


def test_a_good_plan_takes_the_line() -> None:
    plan = _plan()
    _run(plan)
    assert plan.out_key == ["c:t:a:" + plan.out_hash[0][:12]] and plan.routes["t"].records == [{"type": "t", "id": "a", "name": "n"}]
    direct = _plan(direct=_direct())
    _run(direct)
    assert direct.out_input == [] and direct.direct is not None and len(direct.direct.routes["t"].ends) == 1


BAD_PLANS: list[tuple[str, Any, type[Exception], str]] = [
    ("not a plan", object(), TypeError, r"BatchPlan\.out_input is missing"),
    ("2-item route", _plan(routes={"t": ([], [])}), TypeError, r"BatchPlan\.routes\['t'\]\.rows is missing"),
    ("route field type", _plan(routes={"t": replace(_route(), rows=())}), TypeError, r"routes\['t'\]\.rows must be list"),
    ("known type", _plan(routes={"t": replace(_route(), known={"a"})}), TypeError, r"\.known must be frozenset or None"),
    ("output type", _plan(out_key=()), TypeError, r"BatchPlan\.out_key must be list, not tuple"),
    ("declared type", _plan(declared="1"), TypeError, r"BatchPlan\.declared must be int or None"),
    ("no routing", _plan(type_field=None), ValueError, r"fixed_type and type_field are both None"),
    ("half memories", _plan(seen_lines={}), ValueError, r"seen_lines, seen_keys, skipped and fresh"),
    ("decline", _plan(decline=None), TypeError, r"decline must be callable"),
    ("incomplete", SimpleNamespace(**{k: getattr(_plan(), k) for k in ("out_input", "out_type")}), TypeError, r"BatchPlan\.out_key is missing"),
    ("direct type", _plan(direct=("routes",)), TypeError, r"BatchPlan\.direct\.routes is missing"),
    ("direct lines", _plan(direct=_direct(lines=2)), ValueError, r"one int64 per line"),
    ("direct prefix", _plan(direct=replace(_direct(), prefixes=["f#L"])), TypeError, r"prefixes\[0\] must be bytes"),
    ("direct route", _plan(direct=replace(_direct(), routes={"t": (1, 2)})), TypeError, r"DirectPlan\.routes\['t'\]\.fields is missing"),
    ("kinds length", _plan(direct=replace(_direct(), routes={"t": replace(_direct_route(), kinds=b"ss")})), ValueError, r"one entry per column"),
    ("kind letter", _plan(direct=replace(_direct(), routes={"t": replace(_direct_route(), kinds=b"x")})), ValueError, r"kinds\[0\]"),
    ("emitted", _plan(direct=replace(_direct(), routes={"t": replace(_direct_route(), emitted=3)})), ValueError, r"emitted is 3"),
    ("field index", _plan(direct=replace(_direct(), routes={"t": replace(_direct_route(), fields={"name": 7})})), ValueError, r"fields"),
    ("dims", _plan(direct=replace(_direct(), routes={"t": replace(_direct_route(), dims=("3",))})), ValueError, r"dims\[0\]"),
]


@pytest.mark.parametrize(("plan", "error", "message"), [case[1:] for case in BAD_PLANS], ids=[case[0] for case in BAD_PLANS])
def test_a_bad_plan_is_an_exception_naming_the_attribute(plan: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        _run(plan)
    if isinstance(plan, native.BatchPlan):
        assert plan.out_input == [] and plan.out_errors == []  # nothing appended before the plan was checked


def test_a_bad_plan_does_not_crash_the_process() -> None:
    """A worker given a 2-item route (what segfaulted the positional tuple) lives on."""
    code = textwrap.dedent(
        """
        from idem_platform_tests.coercion.test_native_plan import BAD_PLANS, _run
        for name, plan, error, _ in BAD_PLANS:
            try:
                _run(plan)
            except error:
                continue
            raise SystemExit(f"{name}: no {error.__name__}")
        print("survived")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "survived"
