-- Upsert tables without order_by are in the source's own order: each commit that writes
-- versions of one draws a number from this sequence, and each version's order is
-- ARRAY[that number, its position in the commit] (the history's _source_order column).
-- A rolled-back commit leaves a gap, which orders nothing.
CREATE SEQUENCE idem.source_order AS bigint;
