# deltafin — top-level wrapper around CMake.
#   make          install missing Debian packages (as root), configure, build
#   make run      build (quietly: only what is rebuilt is shown), then run the default model on the default prompt
#   make test     build, then run every test (CTest); prints each test program's "N passed, N failed" line
#   make fuzz     build the libFuzzer programs (clang) in build-fuzz and run each for FUZZ_SECONDS (tests/fuzz/README.md)
BUILD ?= build
JOBS  ?= $(shell nproc)
PROMPT ?= In the beginning God created the heaven and the earth. And the earth was
MAXNEW ?= 32
SHELL := /bin/bash

.PHONY: all deps configure run test clean asan fuzz

all: configure
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

deps:
	@./tools/deps.sh

configure: deps
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

# `make run` with nothing to rebuild starts the model at once: when no source file or source
# directory (an added / removed file changes its directory) is newer than the binary, the
# build (about a second of make checking every target) is skipped; otherwise only the
# deltafin target is built, without the "Built target" lines (compiler lines, warnings and
# errors still show). Source files: every kind CMake builds or reads (C sources and headers,
# the CUDA backend's .cu / .cuh, CMakeLists.txt and cmake/ files); tests/e2e_make.sh checks it.
SRC_NEWER = find src include cmake CMakeLists.txt \( -type d -o -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' \
            -o -name '*.txt' -o -name '*.cmake' \) -newer $(BUILD)/deltafin -print -quit 2>/dev/null
run: configure
	@if [ ! -x $(BUILD)/deltafin ] || [ -n "$$($(SRC_NEWER))" ]; then \
	  set -o pipefail; cmake --build $(BUILD) -j $(JOBS) --target deltafin -- --no-print-directory 2>&1 | \
	    { grep -v -E '^\[ *[0-9]+%\] Built target ' || true; }; fi
	@./tools/run-default.sh '$(subst ','"'"',$(value PROMPT))' '$(subst ','"'"',$(value MAXNEW))'

test: all
	@./tools/deps.sh --test
	@./tools/ctest-summary.sh $(BUILD) $(JOBS)

asan: deps
	cmake -S . -B build-asan -DDF_ASAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build build-asan -j $(JOBS) -- --no-print-directory

FUZZ_SECONDS ?= 60
fuzz: deps
	@./tools/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) build-asan build-fuzz
