#!/usr/bin/env bash
# bench/prereq.sh: the first step of `make bench` on a fresh Debian machine: the build tools that `make`
# needs (cmake, ninja, gcc, g++) and python3 for the driver, installed when running as root and missing;
# otherwise named. The benchmark's own needs (the venv, the peer allocators) are bench/run.sh's.
set -euo pipefail
missing=()
for tool in cmake:cmake ninja:ninja-build gcc:gcc g++:g++ python3:python3 protoc-c:protobuf-c-compiler; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
# The heap profiler's libraries (protobuf-c, zlib, libunwind for stacks, libdw for the leak report's
# file:line): their headers.
[ -e /usr/include/protobuf-c/protobuf-c.h ] || missing+=(libprotobuf-c-dev)
[ -e /usr/include/zlib.h ] || missing+=(zlib1g-dev)
[ -e /usr/include/elfutils/libdwfl.h ] || missing+=(libdw-dev)
[ -e /usr/include/x86_64-linux-gnu/libunwind.h ] || [ -e /usr/include/libunwind.h ] || missing+=(libunwind-dev)
((${#missing[@]})) || exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "bench/prereq.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" >&2 || { apt-get update -q >&2 && apt-get install -y -q "${missing[@]}" >&2; }
else
  echo "bench/prereq.sh: missing ${missing[*]}: install them (apt-get install ${missing[*]})" >&2
  exit 1
fi
