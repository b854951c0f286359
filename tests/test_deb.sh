#!/usr/bin/env bash
# test_deb.sh: the Debian package end to end, as root (.ci/run runs it): `make deb`, install the .deb with
# apt-get (its Depends and Recommends with it), use only the installed copy, then purge the package and what
# apt-get brought along, and check that none of its files is left. Checked on the installed copy: its files;
# tests/consumer/prog.c built with pkg-config and with find_package(threadheap) and run (malloc is
# threadheap's); the package's version, th_version(), `threadheap --version` and CMake's project version
# agree; `threadheap run`; a heap profile the library writes, read by `threadheap profile` with Debian's
# protobuf; `threadheap bench` without rich or matplotlib; `man threadheap`.
# JOBS (make's) and BUILD (default build) are passed on to `make deb`.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" != 0 ]; then
  echo "test_deb.sh: needs root (it installs and removes the package)"
  exit 1
fi
if dpkg-query -W -f='${Status}\n' threadheap 2>/dev/null | grep -q ' installed$'; then
  echo "test_deb.sh: the threadheap package is installed already; the test would remove it"
  exit 1
fi
tmp=$(mktemp -d) || exit 1
fail=0
# Nothing from the build tree may leak in through the environment.
unset TH_LIB TH_BIN_DIR PYTHONPATH LD_PRELOAD LD_LIBRARY_PATH THREADHEAP_SHOW_STATS THREADHEAP_VERBOSE
# Run as root, the command leaves __pycache__ in the installed package, which removal must take away too.
unset PYTHONDONTWRITEBYTECODE
export XDG_CACHE_HOME="$tmp/cache"

installed_packages() {
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" { print $2 }' | sort
}
# Leaves the machine as it was: the package, and the packages its installation added, purged.
cleanup() {
  apt-get purge -y -qq threadheap >/dev/null 2>&1
  if [ -f "$tmp/before" ]; then
    added=$(installed_packages | comm -13 "$tmp/before" -)
    # shellcheck disable=SC2086
    [ -z "$added" ] || apt-get purge -y -qq $added >/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$root/tests/check.sh"

if ! make -C "$root" BUILD="$build" deb >"$tmp/make.log" 2>&1; then
  echo "FAIL make deb"
  tail -40 "$tmp/make.log"
  exit 1
fi
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/deb/CMakeCache.txt")
deb=$build/threadheap_${version}_$(dpkg --print-architecture).deb
check "make deb wrote $deb" test -f "$deb"
[ -f "$deb" ] || exit 1
triplet=$(gcc -print-multiarch)
lib=/usr/lib/$triplet/libthreadheap.so

installed_packages >"$tmp/before"
if ! apt-get install -y -q "$deb" >"$tmp/apt.log" 2>&1 &&
  ! { apt-get update -q && apt-get install -y -q "$deb"; } >>"$tmp/apt.log" 2>&1; then
  echo "FAIL apt-get install $deb"
  tail -20 "$tmp/apt.log"
  exit 1
fi
echo "ok   apt-get install $deb"

# The package: its version and what it declares.
check "package version is CMake's $version" test "$(dpkg-query -W -f='${Version}' threadheap)" = "$version"
# The package names alone, one a line: "libc6 (>= 2.34), python3" -> libc6, python3.
dpkg-query -W -f='${Depends}' threadheap | tr ',|' '\n\n' | awk '{ print $1 }' >"$tmp/depends"
for dep in python3 libc6 libprotobuf-c1 zlib1g libunwind8; do
  check "Depends: $dep" grep -qx "$dep" "$tmp/depends"
done
for f in "$lib" "$lib.0" "$lib.$version" "/usr/lib/$triplet/libthreadheap.a" /usr/include/threadheap.h \
  /usr/include/threadheap.hpp "/usr/lib/$triplet/pkgconfig/threadheap.pc" \
  "/usr/lib/$triplet/cmake/threadheap/threadheapConfig.cmake" /usr/bin/threadheap \
  /usr/share/threadheap/python/threadheap/cli.py /usr/share/threadheap/proto/profile.proto \
  /usr/libexec/threadheap/touch; do
  check "installed $f" test -e "$f"
done
check "the package holds the man page" sh -c "dpkg -L threadheap | grep -qx /usr/share/man/man1/threadheap.1.gz"

# Programs built against the installed copy, from the default search paths alone.
cd "$tmp" || exit 1
# shellcheck disable=SC2016
check "pkg-config build" sh -c 'cc -o prog_pc "$1" $(pkg-config --cflags --libs threadheap)' - \
  "$root/tests/consumer/prog.c"
check "pkg-config program runs, th_version() is $version" sh -c "./prog_pc | grep -qx 'installed $version'"
check "pkg-config program uses the installed library" \
  sh -c "ldd ./prog_pc | grep -Eq 'libthreadheap\\.so\\.0 => (/usr)?/lib/$triplet/libthreadheap\\.so\\.0'"
check "find_package configure" cmake -S "$root/tests/consumer" -B "$tmp/proj" -G Ninja -DTH_VERSION="$version"
check "find_package build" cmake --build "$tmp/proj"
check "find_package shared program runs, th_version() is $version" \
  sh -c "'$tmp/proj/prog_shared' | grep -qx 'installed $version'"
check "find_package static program runs" "$tmp/proj/prog_static"

# The command.
check "threadheap --version is $version" sh -c "threadheap --version | grep -qx 'threadheap $version'"
check "threadheap run -- /bin/true" threadheap run -- /bin/true
check "threadheap run preloads the installed library" \
  sh -c "threadheap run -- sh -c 'echo \"\$LD_PRELOAD\"' | grep -q '/lib/$triplet/libthreadheap.so'"
check "the installed library writes a heap profile" \
  env THREADHEAP_PROFILE="$tmp/heap.pb.gz" THREADHEAP_PROFILE_RATE=4K ./prog_pc
# The command runs Debian's python3, which sees python3-protobuf when the Recommends were installed.
if /usr/bin/python3 -c 'import google.protobuf' 2>/dev/null; then
  check "threadheap profile reads it (Debian's protobuf)" \
    sh -c "threadheap profile '$tmp/heap.pb.gz' | grep -q inuse_space"
  check "threadheap run --profile" threadheap run --profile "$tmp/run.pb.gz" -- ./prog_pc
else
  check "threadheap profile without protobuf: one line naming the packages" \
    sh -c "! threadheap profile '$tmp/heap.pb.gz' 2>err; test \$(wc -l <err) = 1 && grep -q python3-protobuf err"
fi
if ! /usr/bin/python3 -c 'import rich, matplotlib' 2>/dev/null; then
  check "threadheap bench without rich or matplotlib: one line" \
    sh -c "! threadheap bench --smoke 2>err; test \$(wc -l <err) = 1 && grep -q 'apt-get install python3-' err"
fi
# dpkg may be set to leave manual pages out (path-exclude in /etc/dpkg/dpkg.cfg.d, as slim images are).
if [ -e /usr/share/man/man1/threadheap.1.gz ]; then
  check "man -w threadheap" sh -c "man -w threadheap | grep -qx /usr/share/man/man1/threadheap.1.gz"
  check "man threadheap lists the options" sh -c "MANPAGER=cat man threadheap | grep -q THREADHEAP_PURGE_DELAY"
else
  echo "skip man threadheap: dpkg leaves /usr/share/man out on this machine"
fi

# Removal: nothing of the package is left, not even the bytecode Python wrote.
cd "$root" || exit 1
check "the command wrote __pycache__ (root)" test -d /usr/share/threadheap/python/threadheap/__pycache__
check "apt-get purge threadheap" apt-get purge -y -q threadheap
for f in "$lib" "$lib.0" "$lib.$version" "/usr/lib/$triplet/libthreadheap.a" /usr/include/threadheap.h \
  "/usr/lib/$triplet/pkgconfig/threadheap.pc" "/usr/lib/$triplet/cmake/threadheap" /usr/bin/threadheap \
  /usr/share/threadheap /usr/libexec/threadheap /usr/share/man/man1/threadheap.1.gz; do
  check "removed $f" test ! -e "$f"
done

echo "$fail failed"
[ "$fail" -eq 0 ]
