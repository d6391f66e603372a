# The two commands a fresh clone needs:  `make serve` (the main job) and `make test` (the test suite).
SHELL := /bin/bash
# The tritonserver that serve and the tests run (nvidia-pytriton's) has Python-backend stubs that need numpy<2, which
# has no release for Python 3.13+: Python 3.11 (pyproject's requires-python) to 3.12 (server/runtime/triton_install.py,
# NEWEST_SERVING_PYTHON). PYTHON, unless given: python3 when it is one of those, else python3.12 or python3.11 on PATH.
# PYTHON_FIT prints which: fits, old (below requires-python) or new (past NEWEST_SERVING_PYTHON).
PYTHON_FIT := import sys; v = sys.version_info[:2]; print("old" if v < (3, 11) else "new" if v > (3, 12) else "fits")
PYTHON ?= $(or $(shell for p in python3 python3.12 python3.11; do \
            [ "$$($$p -c '$(PYTHON_FIT)' 2>/dev/null)" = fits ] && { echo $$p; break; }; done),python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The suite runs in this many processes (pytest-xdist), a test file's tests in one of them, so each file's servers and
# fixtures are shared as written. Half the suite's serial time is spent waiting on servers and subprocesses, so 2
# processes on 2 cores take about 40 % less; PYTEST_WORKERS=0 runs it in make's own pytest process (for pdb).
PYTEST_WORKERS ?= 2

.PHONY: setup test serve lint browser clean venv-python

# TORCH_INDEX_URL: a package index that torch and torchvision are installed from first, before the rest, such as
# PyTorch's CPU-only wheels (https://download.pytorch.org/whl/cpu) on a host without an NVIDIA GPU, where the default
# torch wheel brings about 3 GB of CUDA libraries. Empty: they come from pip's own index, with the rest. It applies when
# .venv is made (`make clean` first to remake one).
TORCH_INDEX_URL ?=
MAJOR_MINOR := import sys; print("%d.%d" % sys.version_info[:2])

# Virtualenv with hub-vit and every extra, editable. Re-run when pyproject.toml changes. Its first line refuses a PYTHON
# that cannot make it, saying which of three: not there (a pyenv shim of a version not selected here is there but does
# not run: its own first line of error says so), below requires-python, or too new to serve.
$(VENV)/.installed: pyproject.toml | venv-python
	@fit=$$($(PYTHON) -c '$(PYTHON_FIT)' 2>/dev/null); [ "$$fit" = fits ] || { \
	  if [ "$$fit" = old ]; then why="$(PYTHON) is $$($(PYTHON) --version 2>&1): hub-vit needs Python 3.11 or later"; \
	  elif [ "$$fit" = new ]; then why="$(PYTHON) is $$($(PYTHON) --version 2>&1): the tritonserver they run"; \
	    why="$$why (nvidia-pytriton, Triton 2.51) has Python-backend stubs that need numpy<2, which has no release for"; \
	    why="$$why Python 3.13 or later"; \
	  elif ! command -v $(PYTHON) >/dev/null; then why="$(PYTHON) was not found"; \
	  else said=$$($(PYTHON) -c '' 2>&1); why="$(PYTHON) did not run ($${said%%$$'\n'*})"; fi; \
	  echo "make setup, serve and test need Python 3.11 to 3.12, and $$why. Install one (uv python install 3.12, or" \
	    "pyenv) and name it: make PYTHON=python3.12 serve" >&2; exit 1; }
	@echo "installing hub-vit and every extra into $(VENV) (a few minutes the first time; quiet until done)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX_URL),$(PY) -m pip install --quiet --index-url $(TORCH_INDEX_URL) torch torchvision)
	$(PY) -m pip install --quiet -e '.[all]'
	touch $@

# A PYTHON given on make's command line must be the one an existing .venv was made with: .venv/.installed depends on
# pyproject.toml alone, so make would otherwise go on with that .venv and its own Python, as if PYTHON had not been
# said. Without a .venv there is nothing to compare: the one made will be PYTHON's.
venv-python:
ifeq ($(origin PYTHON),command line)
	@have=$$($(PY) -c '$(MAJOR_MINOR)' 2>/dev/null) || exit 0; \
	want=$$($(PYTHON) -c '$(MAJOR_MINOR)' 2>/dev/null); [ "$$want" = "$$have" ] || { \
	  echo "the existing $(VENV) uses Python $$have, and PYTHON=$(PYTHON) is $${want:+Python }$${want:-not found}:" \
	    "make keeps an existing $(VENV) as it is. Run make clean first to make it anew with $(PYTHON), or leave" \
	    "PYTHON= out to use it." >&2; exit 1; }
endif

# numpy 2 in a folder of its own: tests/host_emulation.py builds a GPU host's numpy-2 main environment with it
$(VENV)/numpy2/.installed: $(VENV)/.installed
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/numpy2 'numpy>=2,<3'
	touch $@

setup: $(VENV)/.installed $(VENV)/numpy2/.installed

# Debian's Chromium for the Playwright browser tests (Playwright cannot download its own browser here), and nginx for
# the demo behind a reverse proxy (tests/test_demo_proxy.py) and the front benchmark's native floor.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: install Debian's 'chromium' package to run the browser tests"; fi; }
	@[ -x /usr/sbin/nginx ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; \
	  else echo "nginx is missing: install Debian's 'nginx' package to run the reverse-proxy test"; fi; }

# The test suite. pytest exit code 5 ("no tests collected", e.g. a -k filter that matches nothing) is reported, not fatal.
test: setup browser
	$(VENV)/bin/ruff check .
	@set +e; $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5)"; exit 0; fi; exit $$rc

# The main job: serve the default model (Triton + the demo). The ports move with HTTP_PORT, GRPC_PORT, METRICS_PORT and
# DEMO_PORT (`make serve HTTP_PORT=9000`); one left unset keeps hub-vit serve's own default.
SERVE_PORTS = $(strip $(if $(HTTP_PORT),--http-port $(HTTP_PORT)) $(if $(GRPC_PORT),--grpc-port $(GRPC_PORT)) \
              $(if $(METRICS_PORT),--metrics-port $(METRICS_PORT)) $(if $(DEMO_PORT),--demo-port $(DEMO_PORT)))
serve: setup
	$(VENV)/bin/hub-vit serve --demo $(SERVE_PORTS)

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
