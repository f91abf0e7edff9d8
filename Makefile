# The two commands a user needs: `make run` and `make test`. Everything else is for developers.
# PY picks the interpreter the venv is built from and VENV where it goes, so CI can build one venv
# per interpreter: `make test PY=/usr/bin/python3 VENV=/tmp/venv-debian`.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint typecheck check install clean

# A venv without pip is what a failed `python3 -m venv` leaves behind (Debian and Ubuntu ship
# venv's ensurepip apart, in python3-venv): it is rebuilt rather than used.
$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "error: atefleet needs Python 3.11 or newer; PY=$(PY) is $$($(PY) -V 2>/dev/null || echo 'not found')." >&2; \
	  echo "Install one (Debian 12's python3 is 3.11) and run: make $(or $(MAKECMDGOALS),run) PY=/path/to/python3.11" >&2; \
	  exit 1; }
	@if ! $(VPY) -m pip --version >/dev/null 2>&1; then \
	  rm -rf $(VENV); \
	  if ! $(PY) -m venv $(VENV) >/dev/null 2>&1; then \
	    rm -rf $(VENV); \
	    echo "error: $(PY) -m venv could not create $(VENV) (venv or ensurepip is missing)." >&2; \
	    echo "On Debian/Ubuntu: sudo apt-get install python3-venv (for another python3.X: python3.X-venv), then run make again." >&2; \
	    exit 1; \
	  fi; \
	fi
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
	$(VPY) -m mypy common workers api reconciler local_substrate guest atefleet sdk
	$(VPY) -m pytest -q

## Run every benchmark in bench/; each prints its figures and ends with one JSON line.
bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(VPY) $$b || exit 1; done

lint: $(STAMP)
	$(VPY) -m ruff check .

typecheck: $(STAMP)
	$(VPY) -m mypy common workers api reconciler local_substrate guest atefleet sdk

clean:
	rm -rf $(VENV) .state .pytest_cache .mypy_cache .ruff_cache
