#!/usr/bin/env bash
# bench/run.sh: what `make bench` runs. Sets up what the benchmark driver needs, then runs the default
# `threadheap bench` (all experiments, all allocators; about five minutes on two cores).
#   - a project-local venv .venv with matplotlib, rich and pytest, made once;
#   - the peer allocators from Debian, installed when running as root, otherwise named and left out.
# Extra arguments go to `threadheap bench`, e.g. `bash bench/run.sh contention --reps 5`.
# BUILD (default build) is the CMake build folder with libthreadheap.so and bin/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
venv="$root/.venv"

if ! "$venv/bin/python" -c 'import matplotlib, rich, pytest' 2>/dev/null; then
  echo "bench/run.sh: setting up $venv (matplotlib, rich, pytest)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check matplotlib rich pytest
fi

declare -A soname=([libmimalloc2.0]=libmimalloc.so.2 [libjemalloc2]=libjemalloc.so.2
                   [libtcmalloc-minimal4]=libtcmalloc_minimal.so.4)
missing=()
for pkg in "${!soname[@]}"; do
  if ! ldconfig -p | grep -q "${soname[$pkg]}"; then missing+=("$pkg"); fi
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bench/run.sh: installing ${missing[*]}" >&2
    apt-get install -y -q "${missing[@]}" >&2 || { apt-get update -q >&2 && apt-get install -y -q "${missing[@]}" >&2; } ||
      echo "bench/run.sh: could not install ${missing[*]}; going on without them" >&2
  else
    echo "bench/run.sh: missing peer allocators: ${missing[*]} (apt-get install them); going on without them" >&2
  fi
fi

export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
export TH_LIB="${TH_LIB:-$build/libthreadheap.so}" TH_BIN_DIR="${TH_BIN_DIR:-$build/bin}"
cd "$root"
exec "$venv/bin/python" -m threadheap bench "$@"
