# Two commands on a fresh machine with only Python 3.11+: `make demo` and `make test`.
# The Makefile bootstraps its own virtualenv; uv comes from the `uv` package on the index.
# The interpreter the virtualenv is made from (`rm -r .venv; make test PYTHON=python3.12` for another):
# the distribution's /usr/bin/python3 where it is 3.11+ and can make a virtualenv, else python3
# from PATH. A distribution's CPython is built with profile-guided optimisation, which pyenv's
# and other source builds are not unless asked: on these 2-CPU machines the suite takes a tenth
# less CPU and 20 s less under Debian's 3.11 than under pyenv's default build of 3.11.
PYTHON ?= $(shell /usr/bin/python3 -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' \
	2>/dev/null && echo /usr/bin/python3 || echo python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv test test-faults test-unit typecheck demo bench bench-synthetic acceptance gpu-wheels gpu-check clean

venv: $(STAMP)

# Byte-code compiled at install: every `rewheel` command then starts without compiling its
# imports (a third of a second, and every time where PYTHONDONTWRITEBYTECODE is set).
# (--clear: a virtualenv made from another interpreter before is made anew, not half-updated)
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/python --version
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[test]'
	$(BIN)/python -m compileall -q -j 0 src/rewheel $(VENV)/lib
	touch $(STAMP)

# The types first (seconds): the package, and the unit layer's fakes against its Protocols.
# TEST_WORKERS pytest workers: more than the 2 CPUs, so that both stay busy while tests wait on
# a service, a timeout or a health check (5 take 229 s; when 5 took 267-296 s, 3 took 388-391 s,
# 4 took 302 s and 6 took 300 s); how tests are grouped and ordered across them: tests/conftest.py.
TEST_WORKERS ?= 5
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder -q
test: venv typecheck
	$(PYTEST) tests

# The fault suites with every kill point, boundary and full-disk case instead of the sample
# `make test` tries (a new spread each run): the 880 kill points alone take some 40 minutes.
FAULT_SUITES := tests/test_killpoints.py tests/test_killpoints_signals.py tests/test_crash_records.py \
	tests/test_crash.py tests/test_full_disk.py
test-faults: venv
	REWHEEL_KILLPOINTS=all $(PYTEST) $(FAULT_SUITES)

typecheck: venv
	$(BIN)/python -m mypy

# The unit layer alone (no process started; about 10 s).
test-unit: venv
	$(BIN)/python -m pytest -q -p no:xdist tests/unit

demo: venv
	$(BIN)/python -m devtools.demo

# The measure of record: a real vLLM release upgraded to the next (downloads ~8 GB once).
# (byte-code compiled first: an edited source would otherwise be compiled by every timed command)
bench: venv
	$(BIN)/python -m compileall -q src/rewheel devtools
	BENCH_REAL=1 $(BIN)/python -m devtools.bench

# The story's recipe on a real vLLM environment: plan = what `uv pip install -U vllm` picks =
# what is installed, staged and not, both reinstall modes, each rolled back byte for byte
# (downloads ~12 GB once into .bench/acceptance; not part of `make test`).
acceptance: venv
	$(BIN)/python -m devtools.acceptance

# The quick one: a synthetic environment of the same shape, no network.
bench-synthetic: venv
	$(BIN)/python -m compileall -q src/rewheel devtools
	$(BIN)/python -m devtools.bench

# The GPU check (docs/service-and-gpus.md#proving-the-gpu-paths-on-your-host): `make gpu-wheels`
# where there is a network fills .gpu-wheels with rewheel, uv and their dependencies (20 MB);
# `make gpu-check` on the NVIDIA host installs them from there with no network and proves the GPU
# paths, with the interpreter that has torch (GPU_PYTHON). It needs no .venv: a GPU host may have
# no index to make one from. Exit status: 0 held, 1 something did not, 2 a missing prerequisite,
# 3 no NVIDIA GPU on this host.
GPU_PYTHON ?= python3
GPU_WHEELS ?= .gpu-wheels
gpu-wheels: venv
	$(BIN)/python -m devtools.gpu_check --build-wheels $(GPU_WHEELS)

gpu-check:
	$(GPU_PYTHON) -m devtools.gpu_check --wheels $(GPU_WHEELS) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .demo .bench .gpu-wheels
