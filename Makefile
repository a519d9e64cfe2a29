# deltafin — top-level wrapper around CMake.
#   make          install missing Debian packages (as root), configure, build
#   make run      build, then run the default model on the default prompt
#   make test     build, then run every test (CTest)
BUILD ?= build
JOBS  ?= $(shell nproc)
PROMPT ?= In the beginning God created the heaven and the earth. And the earth was
MAXNEW ?= 32

.PHONY: all deps configure run test clean asan

all: configure
	cmake --build $(BUILD) -j $(JOBS)

deps:
	@./tools/deps.sh

configure: deps
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

run: all
	@./tools/run-default.sh '$(subst ','"'"',$(value PROMPT))' '$(subst ','"'"',$(value MAXNEW))'

test: all
	@./tools/deps.sh --test
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

asan: deps
	cmake -S . -B build-asan -DDF_ASAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build build-asan -j $(JOBS)

clean:
	rm -rf $(BUILD) build-asan
