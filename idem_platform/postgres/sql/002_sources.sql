-- Sources beyond files: a reject keeps its source's metadata (a Kafka message's
-- topic, partition, offset, key and headers); committed offsets say when they moved.
ALTER TABLE idem.rejects ADD COLUMN context jsonb;
ALTER TABLE idem.source_offsets ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
