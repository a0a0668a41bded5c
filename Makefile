# The two commands of the README, plus the steps they are made of.
#   make demo   install missing packages, build Release, plan the built-in default batch, then run
#               a small batch for real on 4 in-process ranks and (with mpirun) on 2 MPI ranks
#   make test   install missing packages, build, run every test (ctest, then the Python package's
#               tests in a virtual environment under $(BUILD): pip install . against PyTorch from PyPI)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_ARGS ?= --profile ldc --seed 1 --cluster a100-p4d --nodes 4 --block 1024
RUN_ARGS ?= --backend cpu --profile ldc --seed 3 --tokens 2048 --block 128 --placement dcp
# Open MPI refuses root unless told; only the demo's own mpirun command gets these variables.
MPI_ENV := $(if $(filter 0,$(shell id -u)),OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1,)

VENV ?= $(BUILD)/venv
# The Python tests run the CPU path; the wheel skips nvcc here (the CMake build above compiles the
# CUDA kernels). On a GPU machine: pip install --no-build-isolation .
PY_INSTALL_FLAGS ?= -C cmake.define.DCP_ENABLE_CUDA=OFF

.PHONY: all deps configure build demo test test-cpp test-python bench clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DDCP_WERROR=ON $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/dcp plan $(DEMO_ARGS) --write-batch $(BUILD)/demo_batch.json
	@echo "(the batch used is in $(BUILD)/demo_batch.json)"
	./$(BUILD)/dcp run $(RUN_ARGS) --ranks 4
	@if command -v mpirun >/dev/null 2>&1; then \
	  echo "$(MPI_ENV) mpirun -np 2 --oversubscribe ./$(BUILD)/dcp run $(RUN_ARGS)"; \
	  $(MPI_ENV) mpirun -np 2 --oversubscribe ./$(BUILD)/dcp run $(RUN_ARGS); \
	else echo "(mpirun not found: skipping the MPI run)"; fi

test: test-cpp test-python

test-cpp: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-python:
	scripts/python-env.sh $(VENV) $(PY_INSTALL_FLAGS)
	cd $(BUILD) && OMP_NUM_THREADS=1 $(abspath $(VENV))/bin/python -m pytest -q $(abspath tests/python)

bench: build
	scripts/bench.sh $(BUILD)

clean:
	rm -rf $(BUILD)
