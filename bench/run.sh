#!/usr/bin/env bash
# bench/run.sh: what `make bench` runs. Sets up what the benchmark driver needs, then runs the default
# `threadheap bench` (all experiments, all allocators, threadheap+profile among them: threadheap with heap
# profiling on, whose row of the closing summary is what profiling costs; at most five minutes on two cores).
#   - the project-local venv .venv with matplotlib, rich and pytest (bench/venv.sh);
#   - the peer allocators from Debian, installed when running as root, otherwise named and left out.
# Extra arguments go to `threadheap bench`, e.g. `bash bench/run.sh contention --reps 5`.
# BUILD (default build) is the CMake build folder with libthreadheap.so and bin/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
venv="$root/.venv"
as_root() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2; }
}

bash "$root/bench/venv.sh"

# The peers: Debian package -> the library the driver preloads. ldconfig's list is read once (a pipe into
# grep -q could end ldconfig with SIGPIPE, which pipefail would count as "missing").
declare -A soname=([libmimalloc2.0]=libmimalloc.so.2 [libjemalloc2]=libjemalloc.so.2
                   [libtcmalloc-minimal4]=libtcmalloc_minimal.so.4)
libs=$(ldconfig -p 2>/dev/null || true)
missing=()
for pkg in libmimalloc2.0 libjemalloc2 libtcmalloc-minimal4; do
  case "$libs" in *"${soname[$pkg]} "*) ;; *) missing+=("$pkg") ;; esac
done
if ((${#missing[@]})); then
  if as_root; then
    echo "bench/run.sh: installing ${missing[*]}" >&2
    apt_install "${missing[@]}" || echo "bench/run.sh: could not install ${missing[*]}; going on without them" >&2
  else
    echo "bench/run.sh: missing peer allocators: ${missing[*]} (as root: apt-get install ${missing[*]});" \
         "going on without them" >&2
  fi
fi

export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
export TH_LIB="${TH_LIB:-$build/libthreadheap.so}" TH_BIN_DIR="${TH_BIN_DIR:-$build/bin}"
# The report records the command that made it: `make bench` when make ran this script with no arguments.
if [ -z "${TH_BENCH_COMMAND:-}" ] && [ -n "${MAKELEVEL:-}" ] && [ $# -eq 0 ]; then
  export TH_BENCH_COMMAND="make bench"
fi
cd "$root"
exec "$venv/bin/python" -m threadheap bench "$@"
