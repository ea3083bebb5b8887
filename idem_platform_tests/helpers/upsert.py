"""idem.yaml of the upsert-table tests: one file drop ``feed`` of ``indicator`` records into
an upsert table, ordered by ``version`` or in the source's order. The pipeline and effects
tests edit these texts (``str.replace``) to state each case, so the texts must stay the
same to the character."""

from __future__ import annotations

FEED = """
connectors:
  - name: feed
    kind: filedrop
    path: drop
    record_type: indicator
    id_field: id
"""

# Versions ordered by ``version``; an ``op: d`` line deletes its identity.
UPSERT = (
    FEED
    + """tables:
  indicator:
    mode: upsert
    order_by: version
    delete_when: {field: op, equals: d}
    columns:
      version: long
      confidence: int
"""
)

# No ``order_by``: versions in the source's own order (commit order, then position).
BY_SOURCE = (
    FEED
    + """tables:
  indicator:
    mode: upsert
    delete_when: {field: op, equals: d}
    columns:
      value: string
"""
)
