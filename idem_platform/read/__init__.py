"""The read path (DESIGN §6): tables in their current shape, old rows upgraded on the executors.

See :mod:`idem_platform.read.table` (:func:`read_table`, :class:`TableRead`).
"""

from idem_platform.read.table import TableRead, migration_errors, migration_failure, read_table

__all__ = ["TableRead", "migration_errors", "migration_failure", "read_table"]
