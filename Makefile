# The three commands of the contract: `make`, `make test`, `make bench`. CMake and Ninja do the work.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)

.PHONY: all test test-stress test-soak tsan asan bench clean

all: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

# Every test except the long stress runs (label "stress", `make test-stress`), the soak (`make test-soak`)
# and the minute of fuzzing (label "fuzzlong", which .ci/run runs).
# The benchmark driver's tests need matplotlib, rich and pytest: bench/venv.sh makes the project's .venv once.
test: all
	bash bench/venv.sh
	ctest --test-dir $(BUILD) --output-on-failure -j 2 -LE 'stress|soak|fuzzlong'

test-stress: all
	ctest --test-dir $(BUILD) --output-on-failure -L stress

# Ten minutes of threads exchanging blocks of 16 B-16 MiB, thread churn, forks and explicit heaps
# (tests/test_soak.c): committed memory bounded, contents intact.
test-soak: all
	ctest --test-dir $(BUILD) --output-on-failure -L soak

# The library's own tests under ThreadSanitizer (concurrency tests) and AddressSanitizer+UBSan (API tests).
# These builds leave out the malloc overrides: the sanitizers bring their own malloc.
tsan:
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTH_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS)
	ctest --test-dir build-tsan --output-on-failure -L tsan

asan:
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTH_SANITIZE=address
	cmake --build build-asan -j $(JOBS)
	ctest --test-dir build-asan --output-on-failure -L asan

# On a fresh machine `make bench` does its own set-up: build tools (bench/prereq.sh), then the build, then
# the venv and the peer allocators (bench/run.sh), then the default run.
bench:
	bash bench/prereq.sh
	$(MAKE) all
	bash bench/run.sh

clean:
	rm -rf $(BUILD) build-tsan build-asan
