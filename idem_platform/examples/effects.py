"""The example's function effect: ``band``, a confidence band per indicator, recorded once per key.

``docs/effects.md`` lists this module under ``effect_modules:`` and names
``idem_platform.examples.effects:band`` as an effect's ``python.function``. An effect
function is called with the JSON payload its ``body:`` builds from the row and the row's
minted key; what it returns (JSON) is recorded in the ledger and the outbox, and a
dispatcher that dies after the call replays that record instead of calling again. This one
acts on nothing outside: a real one would call a service with ``key`` as its idempotency
key, or write through its own transaction.
"""

from typing import Any

BANDS = ((67, "high"), (34, "medium"), (0, "low"))


def band(payload: dict[str, Any], key: str) -> dict[str, Any]:
    """The indicator's confidence band (``low`` below 34, ``medium`` below 67, else ``high``)."""
    confidence = payload.get("confidence")
    if not isinstance(confidence, int):
        return {"indicator": payload.get("indicator"), "band": None}
    name = next(label for floor, label in BANDS if confidence >= floor)
    return {"indicator": payload.get("indicator"), "band": name}
