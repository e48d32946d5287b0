# Everything a fresh machine needs: `make demo` and `make test` create the virtualenv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-flow bench-peers reliability clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# Three processes on two cores: most of a test's time is spent waiting on servers. Each
# test file runs whole in one process (its module-scoped servers are started once).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 3 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/bench_core.py
	$(BIN)/python bench/bench_enqueue.py

# Flow control (issue #31): what limits cost, how exactly a rate limit holds, how fairly
# limit keys take turns. About 8 minutes; ARGS=--quick for a smoke run of about 2.
bench-flow: $(STAMP)
	$(BIN)/python bench/bench_flow.py $(ARGS)

# duetime against RQ, arq, Dramatiq, Huey, Celery, SAQ, BullMQ and Docket; installs the peers
# into bench/.venv-peers (not into .venv). Long: use --quick via ARGS for a smoke run.
bench-peers: $(STAMP)
	$(BIN)/python bench/peers/run.py $(ARGS)

reliability: $(STAMP)
	DUETIME_SOAK=1 $(BIN)/python -m pytest tests/reliability -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
