# The three commands of the contract: `make`, `make test`, `make bench`. CMake and Ninja do the work.
# On a fresh Debian 12 machine `make test`, `make bench` and `make deb` set themselves up: scripts/setup.sh
# installs (as root) or names what is missing, before CMake runs.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)

.PHONY: all test test-stress test-soak tsan asan bench deb clean

all: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

# Every test except the long stress runs (label "stress", `make test-stress`), the soak (`make test-soak`)
# and the minute of fuzzing (label "fuzzlong", which .ci/run runs).
# The benchmark driver's tests need matplotlib, rich and pytest: bench/venv.sh makes the project's .venv once.
test:
	bash scripts/setup.sh
	$(MAKE) all
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

# `make bench`: the packages (scripts/setup.sh), the build, then bench/run.sh: the venv and the default run.
bench:
	bash scripts/setup.sh
	$(MAKE) all
	bash bench/run.sh

# The Debian package, $(BUILD)/threadheap_<version>_amd64.deb (cmake/package.cmake), from a Release build of
# its own in $(BUILD)/deb: prefix /usr, the command on Debian's python3, no tests. tests/test_deb.sh installs
# and checks it.
deb:
	bash scripts/setup.sh
	cmake -S . -B $(BUILD)/deb -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
	  -DTH_INSTALL_PYTHON=/usr/bin/python3 -DBUILD_TESTING=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD)/deb -j $(JOBS)
	cd $(BUILD)/deb && cpack -G DEB -B "$(abspath $(BUILD))"

clean:
	rm -rf $(BUILD) build-tsan build-asan
