"""The quarantine as a source: a connector's rejects, read back and committed once they pass.

``idem rejects retry`` (and the ``<connector>_retry_rejects`` Dagster job) plans the
connector's quarantined rows as a batch like any other source's: one unit per
original ``(commit, source)`` whose position prefix is the original one, so a
record that passes now gets the key it would have had the first time; slices of
reject ids that Spark tasks read from ``idem.rejects``; and a commit step that
marks the rejects retried inside the applying transaction (a compare-and-set, so
two retries never both take a row) and leaves those that still fail quarantined
with the reasons they fail for now.
"""

from idem_platform.sources.rejects.plan import RetryPlan, plan_retry
from idem_platform.sources.rejects.reader import RejectsSlice
from idem_platform.sources.rejects.step import RejectsRetried

__all__ = ["RejectsRetried", "RejectsSlice", "RetryPlan", "plan_retry"]
