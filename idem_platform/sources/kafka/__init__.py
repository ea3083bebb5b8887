"""The Kafka connector: offset ranges read by assignment, offsets moved in the rows' transaction.

Nothing here joins a consumer group: each Spark task assigns itself exactly its
partition's offsets and reads them with ``isolation.level=read_committed``.
The offsets that count live in ``idem.source_offsets`` and advance with a
compare-and-set inside the applying transaction; the consumer group only
mirrors them afterwards, for lag tools.
"""
