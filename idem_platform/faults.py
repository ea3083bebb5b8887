"""Named crash points for tests: prove that a crash at any step leaves nothing half-done.

``IDEM_FAULT=<point>:<action>[:<arg>][:<key>=<value>,...]`` arms one point in every
process that inherits the environment (the driver, Spark's Python workers) or gets
it through ``spark.executorEnv.IDEM_FAULT`` (a cluster's executors):

* ``pause:<marker path>`` writes the marker and sleeps, so a test can SIGKILL the
  whole process group at exactly that moment (a machine that dies);
* ``hold:<marker path>`` writes the marker and waits until the test deletes it, then
  goes on: the test acts on the paused run from outside (terminates its PostgreSQL
  backend, takes its claim over) and lets it meet the consequence, with no timing;
* ``sleep:<seconds>`` slows the point down (a straggler, for speculation);
* ``crash`` kills the current process with SIGKILL;
* ``raise`` raises :class:`InjectedFault` (a clean failure).

The optional filters match the keyword arguments the checkpoint passes, e.g.
``staging:sleep:30:split=0,attempt=0`` slows only the first attempt of split 0.
Unset (always, in production) every checkpoint is a dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from idem_platform.settings import fault_from_environment

POINTS = (
    "claimed",  # the units' ledger rows are this run's and its staging tables exist
    "before_stage", "staging",
    "before_apply", "during_apply", "after_apply",  # around the applying transaction's COMMIT
    "migrate_batch",  # idem migrate: after each committed batch (record_type, partition, batch)
    "effect_sent",  # idem effects deliver: a row sent (a function's result recorded), its answer not yet (effect)
)

# The former names of renamed points, still accepted in IDEM_FAULT until the next release
# (scripts and CI jobs set them; "promote" now names only ``idem retype``'s old alias).
ALIASES = {
    "before_promote": "before_apply",
    "during_promote": "during_apply",
    "after_promote": "after_apply",
}


class InjectedFault(RuntimeError):
    """Raised by a ``raise`` fault."""


def checkpoint(point: str, **context: object) -> None:
    """Fire the armed fault if it is armed for ``point`` (and its filters match ``context``)."""
    spec = fault_from_environment()
    if not spec:
        return
    name, _, rest = spec.partition(":")
    if ALIASES.get(name, name) != point:
        return
    parts = rest.split(":")
    action = parts[0]
    arg = parts[1] if len(parts) > 1 else ""
    if len(parts) > 2 and parts[2]:
        wanted = dict(item.split("=", 1) for item in parts[2].split(","))
        if any(str(context.get(key)) != value for key, value in wanted.items()):
            return
    if action == "pause":
        Path(arg).write_text(str(os.getpid()))
        while True:
            time.sleep(3600)
    if action == "hold":
        marker = Path(arg)
        marker.write_text(str(os.getpid()))
        while marker.exists():
            time.sleep(0.05)
    if action == "sleep":
        time.sleep(float(arg))
    if action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "raise":
        raise InjectedFault(f"fault injected at {point}")
