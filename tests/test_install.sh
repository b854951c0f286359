#!/bin/sh
# test_install.sh BUILD_DIR: `cmake --install` into a temporary prefix, then use only the installed copy:
# build tests/consumer/prog.c against it with pkg-config and with find_package(threadheap) (shared and
# static), run each (the program checks that malloc is threadheap's and prints th_version(), which must be
# the build's version, as must `threadheap --version`), and run the installed `threadheap run`.
set -u
build=$(cd "${1:?usage: test_install.sh BUILD_DIR}" && pwd) || exit 1
consumer=$(cd "$(dirname "$0")/consumer" && pwd) || exit 1
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[ -n "$version" ] || { echo "FAIL no CMAKE_PROJECT_VERSION in $build/CMakeCache.txt"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
prefix=$tmp/prefix
fail=0
# Nothing from the build tree may leak in through the environment.
unset TH_LIB TH_BIN_DIR PYTHONPATH LD_PRELOAD LD_LIBRARY_PATH THREADHEAP_SHOW_STATS THREADHEAP_VERBOSE
# run --stats prices a page fault once and caches it: in the temporary folder, not the home directory.
export XDG_CACHE_HOME="$tmp/cache"

. "$(dirname "$0")/check.sh"

if ! cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
  echo "FAIL cmake --install"
  cat "$tmp/install.log"
  exit 1
fi
libdir=$(dirname "$(find "$prefix" -name libthreadheap.so -print | head -1)")
for f in "$libdir/libthreadheap.so" "$libdir/libthreadheap.a" "$prefix/include/threadheap.h" \
  "$libdir/pkgconfig/threadheap.pc" "$libdir/cmake/threadheap/threadheapConfig.cmake" "$prefix/bin/threadheap" \
  "$prefix/share/man/man1/threadheap.1.gz"; do
  check "installed $f" test -e "$f"
done

# pkg-config, shared library.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
check "pkg-config build" \
  sh -c "cc -o '$tmp/prog_pc' '$consumer/prog.c' \$(pkg-config --cflags --libs threadheap)"
check "pkg-config program runs" env LD_LIBRARY_PATH="$libdir" "$tmp/prog_pc"
check "pkg-config program's th_version() is $version" \
  sh -c "LD_LIBRARY_PATH='$libdir' '$tmp/prog_pc' | grep -qx 'installed $version'"
check "pkg-config program uses the installed library" \
  sh -c "LD_LIBRARY_PATH='$libdir' ldd '$tmp/prog_pc' | grep -q '$libdir/libthreadheap.so'"
# With only the static library in a folder of its own, -lthreadheap can only be the archive.
mkdir -p "$tmp/static/pkgconfig"
cp "$libdir/libthreadheap.a" "$tmp/static/"
sed -e "s|^prefix=.*|prefix=$prefix|" -e "s|^libdir=.*|libdir=$tmp/static|" "$libdir/pkgconfig/threadheap.pc" \
  >"$tmp/static/pkgconfig/threadheap.pc"
check "pkg-config --static build" sh -c "PKG_CONFIG_PATH='$tmp/static/pkgconfig' && export PKG_CONFIG_PATH && \
  cc -o '$tmp/prog_pcs' '$consumer/prog.c' \$(pkg-config --static --cflags --libs threadheap)"
check "pkg-config static program has no libthreadheap.so" \
  sh -c "test -x '$tmp/prog_pcs' && ! ldd '$tmp/prog_pcs' | grep -q libthreadheap"
check "pkg-config static program runs" "$tmp/prog_pcs"

# find_package(threadheap): the shared and the static target.
check "find_package configure" \
  cmake -S "$consumer" -B "$tmp/proj/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DTH_VERSION="$version"
check "find_package build" cmake --build "$tmp/proj/build"
check "find_package shared program runs" "$tmp/proj/build/prog_shared"
check "find_package shared program uses the installed library" \
  sh -c "ldd '$tmp/proj/build/prog_shared' | grep -q '$libdir/libthreadheap.so'"
check "find_package static program runs" "$tmp/proj/build/prog_static"
check "find_package static program has no libthreadheap.so" \
  sh -c "test -x '$tmp/proj/build/prog_static' && ! ldd '$tmp/proj/build/prog_static' | grep -q libthreadheap"

# The installed command, from a folder outside the source and build trees.
cd "$tmp" || exit 1
check "installed threadheap --version is $version" \
  sh -c "'$prefix/bin/threadheap' --version | grep -qx 'threadheap $version'"
"$prefix/bin/threadheap" run --stats -- /bin/true >"$tmp/run.out" 2>"$tmp/run.err"
rc=$?
if [ "$rc" = 0 ] && grep -q "minor page faults" "$tmp/run.err" && grep -q "committed_peak" "$tmp/run.err" &&
  ! grep -q "not calibrated" "$tmp/run.err"; then
  echo "ok   installed threadheap run --stats -- /bin/true"
else
  echo "FAIL installed threadheap run --stats -- /bin/true (exit $rc)"
  cat "$tmp/run.out" "$tmp/run.err"
  fail=$((fail + 1))
fi
# The installed launcher must preload the installed library, not the build tree's.
"$prefix/bin/threadheap" run -- sh -c 'echo "$LD_PRELOAD"' >"$tmp/preload.out" 2>&1
check "installed threadheap run preloads the installed library" grep -q "^$libdir/libthreadheap.so" "$tmp/preload.out"
"$prefix/bin/threadheap" run -- sh -c 'exit 7' >/dev/null 2>&1
check "installed threadheap run passes the exit status" test $? = 7

echo "$fail failed"
[ "$fail" -eq 0 ]
