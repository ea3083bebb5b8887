"""Outbound keys: :func:`mint_key`, the key of a call a handler makes to someone else.

Apart from the ledger call because it is pure (no connection, no ledger): the
key is derived from what identifies the call, so a retried handler sends the
same one.
"""

from __future__ import annotations

from idem_platform.contract.keys import minted_key


def mint_key(*parts: str) -> str:
    """:func:`minted_key` of ``parts``: ``mint_key("tenant-1", "job-42", "1")``.

    The key of an outbound call, built from what identifies it (never from a
    clock or a random number), so the retry of a handler sends the same key.
    """
    return minted_key(parts)

