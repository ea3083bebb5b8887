"""Calls made at once, in threads, for the tests of what two runs do side by side."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def at_once(target: Callable[[T], object], items: Iterable[T]) -> list[BaseException]:
    """Call ``target`` on each of ``items``, each in its own thread, every thread started before
    any is joined; what the calls raised (an exception in a thread is otherwise lost and the
    test would pass), for the test to assert on."""
    failures: list[BaseException] = []

    def call(item: T) -> None:
        try:
            target(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            failures.append(exc)

    threads = [threading.Thread(target=call, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures
