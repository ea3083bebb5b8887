"""Connectors: each plans the units and slices of its source into one :class:`SourceBatch`.

``filedrop`` (files dropped into a directory) and ``kafka`` (offset ranges of
topics) share everything after planning: the coercion, the staging and the one
applying transaction.
"""

from idem_platform.write.batch import RECORDS_SCHEMA, CommitStep, Slice, SourceBatch, Unit

__all__ = ["RECORDS_SCHEMA", "CommitStep", "Slice", "SourceBatch", "Unit"]
