"""The C path is reentrant: a call made while another is mid-line does not disturb it.

Python code can run in the middle of a line: the cyclic garbage collector may start on
any container the C path allocates, and its callbacks (or a finalizer it runs) are Python,
free to coerce another line. Each call has its own scratch buffers, so the outer line's
bytes, values and rows come out as they would with nothing in between.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from idem_platform.coercion import native
from idem_platform.coercion.records import DirectRows, RepeatedLines, coerce_batch
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.fuzz import BASE_SPEC

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="the C extension is not built")

OTHER = b'{"zz":"another line","q":[9,[8,{"k":7.25}]],"\\u00e9":"\\ud83d\\ude00"}'


@contextmanager
def nested_calls_in_every_collection(call: Callable[[], Any]) -> Iterator[list[Any]]:
    """Run ``call`` at the start of every collection of the cyclic garbage collector, which
    starts at every container allocated (threshold 1) while the block runs."""
    results: list[Any] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            results.append(call())

    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        yield results
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)


def _nested_line() -> Any:
    assert native.canonical_line is not None
    return native.canonical_line(OTHER, frozenset())


def test_a_line_read_while_another_call_runs_inside_it() -> None:
    assert native.canonical_line is not None
    line = json.dumps({f"k{n}": [{"a": [n, n + 0.5, "é"]}, {"b": None}] for n in range(40)}).encode()
    expected = native.canonical_line(line, frozenset())
    nested_expected = _nested_line()
    with nested_calls_in_every_collection(_nested_line) as nested:
        got = native.canonical_line(line, frozenset())
    assert nested, "no collection ran inside the call: the test proves nothing"
    assert got == expected
    assert all(result == nested_expected for result in nested)


@pytest.mark.parametrize("direct", [False, True])
def test_a_batch_coerced_while_lines_are_read_inside_it(direct: bool) -> None:
    lines = [
        json.dumps({"type": kind, "id": f"{kind}-{n}", "name": f"n{n}", "tags": {"t": [n]}, "score": n / 3,
                    "labels": ["x"] * (n % 3), **({"extra_field": n} if n % 7 == 0 else {})}).encode()
        for n, kind in enumerate(["indicator", "malware", "threat-actor"] * 30)
    ]
    spec = replace(BASE_SPEC, spark_types=True, dynamic_values=False)

    def run() -> tuple[Any, Any]:
        rows = DirectRows(list(spec.tables)) if direct else None
        out = coerce_batch(lines_batch(lines + lines[:5]), spec, RepeatedLines(), rows)
        return out.to_pylist(), (rows.rows, rows.keys, rows.ends) if rows is not None else None

    expected = run()
    with nested_calls_in_every_collection(_nested_line) as nested:
        got = run()
    assert nested
    assert got == expected
