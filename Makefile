# tf_commlib: `make demo` runs the main job, `make test` the tests; both install first.
SHELL := /bin/bash
export TF_CPP_MIN_LOG_LEVEL ?= 2
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
NP ?= 4
OP_SOURCES := $(shell find ops -name "*.cc" -o -name "*.h")

.PHONY: install test demo cuda-check bench-topk clean

install: $(VENV)/.apt $(VENV)/.requirements $(VENV)/.horovod $(VENV)/.editable tf_commlib/_build_info.json \
	datacache/_build_info.json

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.apt: scripts/install_apt.sh | $(VENV)/bin/python
	bash scripts/install_apt.sh
	touch $@

$(VENV)/.requirements: requirements.txt | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

$(VENV)/.horovod: scripts/build_horovod.sh $(wildcard third_party/horovod_patches/*.patch) $(VENV)/.requirements
	bash scripts/build_horovod.sh $(VENV)
	touch $@

$(VENV)/.editable: setup.py $(VENV)/.horovod
	$(VENV)/bin/pip install -q --no-build-isolation --no-deps -e .
	touch $@

# One build_ext builds both op libraries (tf_commlib's and datacache's), each writing its
# _build_info.json: a grouped target, remade when either is missing or any ops/ source changed.
tf_commlib/_build_info.json datacache/_build_info.json &: $(OP_SOURCES) setup.py tf_commlib/_sources.py \
		datacache/_sources.py $(VENV)/.editable
	$(PY) setup.py -q build_ext --inplace

test: install
	$(VENV)/bin/python -m pytest -q tests

demo: install
	$(PY) -m tfc_apps.demo

# Compiles the CUDA kernels with nvcc (no TensorFlow needed), to check them on a CPU-only machine.
cuda-check:
	bash scripts/cuda_check.sh

bench-topk: install
	$(PY) -m tfc_apps.bench topk

clean:
	rm -rf build tf_commlib/_tf_commlib_ops*.so tf_commlib/_build_info.json \
		datacache/_datacache_ops*.so datacache/_build_info.json
