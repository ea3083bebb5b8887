"""What the tests share besides fixtures: builders of configs, batches and commands, the
oracles several test modules check against, and the real services they start (a Kafka-protocol
broker, a standalone Spark cluster, a push load).

Fixtures live in ``conftest.py``; everything here is plain code, so that test modules and
the benchmarks import it without importing another test module (whose tests would then be
collected twice) or ``conftest.py`` (which pytest imports under its own rules).
"""
