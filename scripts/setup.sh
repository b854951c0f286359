#!/usr/bin/env bash
# scripts/setup.sh: the Debian 12 packages that building, testing, benchmarking and packaging threadheap
# need, in one list. `make test`, `make bench`, `make deb` and .ci/run run it first. As root it installs
# what is missing; as another user it names it on one line and exits 1. When nothing is missing it costs one
# dpkg-query (milliseconds).
set -euo pipefail
packages=(
  # the build, and the heap profiler's libraries (protobuf-c, zlib, libunwind; libdw's header)
  cmake ninja-build make gcc g++ binutils pkg-config
  protobuf-c-compiler libprotobuf-c-dev zlib1g-dev libunwind-dev libdw-dev
  # the command, and the project's venv for the benchmark driver and its tests (bench/venv.sh)
  python3 python3-venv python3-pip
  # the tests: valgrind (explicit heaps as memcheck pools), clang with libFuzzer, go (`go tool pprof` reads
  # every profile), tmux (top's live view), the real programs and the server
  valgrind clang libclang-rt-14-dev golang-go tmux sqlite3 perl git xz-utils coreutils procps memcached
  # GNU time: the real programs' peak RSS (bench/programs.py)
  time
  # the peer allocators of the benchmarks and the real-program runs
  libmimalloc2.0 libjemalloc2 libtcmalloc-minimal4
  # `make deb` (CPack's Depends come from dpkg-shlibdeps, which needs file) and its test (man)
  dpkg-dev file man-db
)

if ! command -v dpkg-query >/dev/null; then
  echo "scripts/setup.sh: not Debian, nothing checked; threadheap needs the equivalents of: ${packages[*]}" >&2
  exit 0
fi
# One call for the whole list; a package dpkg has never heard of prints nothing and is missing too.
installed=" $(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null |
  awk '$NF == "installed" { printf "%s ", $1 }' || true)"
missing=()
for p in "${packages[@]}"; do
  case "$installed" in *" $p "*) ;; *) missing+=("$p") ;; esac
done
((${#missing[@]})) || exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "scripts/setup.sh: missing ${missing[*]}; as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "scripts/setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# The package lists are fetched only when there are none (a fresh machine), or when an install fails on stale
# ones.
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
  apt-get update -qq
fi
apt-get install -y -qq "${missing[@]}" >/dev/null ||
  { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
