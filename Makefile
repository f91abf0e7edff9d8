# The two commands a user needs: `make run` and `make test`. Everything else is for developers.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint typecheck check install clean

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Start the whole fleet on the embedded defaults (embedded Redis, embedded local Substrate), port 7777.
run: $(STAMP)
	$(VENV)/bin/atefleet up

## Run the whole test suite (real Redis, real gRPC, real sandboxed guests, real HTTP).
test: $(STAMP)
	$(VPY) -m ruff check .
	$(VPY) -m mypy common
	$(VPY) -m pytest -q

## Run every benchmark in bench/; each prints its figures and ends with one JSON line.
bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(VPY) $$b || exit 1; done

lint: $(STAMP)
	$(VPY) -m ruff check .

typecheck: $(STAMP)
	$(VPY) -m mypy common

clean:
	rm -rf $(VENV) .state .pytest_cache .mypy_cache .ruff_cache
