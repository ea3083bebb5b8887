"""The exactly-once commit, Spark-agnostic: the batch every source plans into, the commit's
plan, per-attempt staging and the one transaction that applies staged rows to the tables."""
