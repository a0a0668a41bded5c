# The two commands of the README, plus the steps they are made of.
#   make demo   install missing packages, build Release, run dcp on the built-in default batch
#   make test   install missing packages, build, run every test (ctest)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_ARGS ?= --profile ldc --seed 1 --cluster a100-p4d --nodes 4 --block 1024

.PHONY: all deps configure build demo test bench clean

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

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

bench: build
	scripts/bench.sh $(BUILD)

clean:
	rm -rf $(BUILD)
