#!/bin/sh
# test_install.sh BUILD_DIR: `cmake --install` into a temporary prefix, then use only the installed copy:
# build a small C program against it with pkg-config and with find_package(threadheap) (shared and static),
# run each (the program checks that malloc is threadheap's), and run the installed `threadheap run`.
set -u
build=$(cd "${1:?usage: test_install.sh BUILD_DIR}" && pwd) || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
prefix=$tmp/prefix
fail=0
# Nothing from the build tree may leak in through the environment.
unset TH_LIB TH_BIN_DIR PYTHONPATH LD_PRELOAD LD_LIBRARY_PATH THREADHEAP_SHOW_STATS THREADHEAP_VERBOSE
# run --stats prices a page fault once and caches it: in the temporary folder, not the home directory.
export XDG_CACHE_HOME="$tmp/cache"

check() { # check NAME COMMAND...: runs COMMAND, reports a failure with its output
  name=$1
  shift
  if "$@" >"$tmp/out" 2>&1; then
    echo "ok   $name"
  else
    echo "FAIL $name"
    tail -20 "$tmp/out"
    fail=$((fail + 1))
  fi
}

if ! cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
  echo "FAIL cmake --install"
  cat "$tmp/install.log"
  exit 1
fi
libdir=$(dirname "$(find "$prefix" -name libthreadheap.so -print | head -1)")
for f in "$libdir/libthreadheap.so" "$libdir/libthreadheap.a" "$prefix/include/threadheap.h" \
  "$libdir/pkgconfig/threadheap.pc" "$libdir/cmake/threadheap/threadheapConfig.cmake" "$prefix/bin/threadheap"; do
  check "installed $f" test -e "$f"
done

# The program: malloc must be threadheap's (th_usable_size stops the process on a pointer it did not
# return), and so must the calloc and realloc that libc calls inside open_memstream. The program itself
# calls only malloc and free, so a static copy linked without --whole-archive would leave libc's calloc and
# realloc in place, and the test would fail.
cat >"$tmp/prog.c" <<'EOF'
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threadheap.h>
int main(void) {
  char *p = malloc(100);
  void *q = th_malloc(5000);
  if (p == NULL || q == NULL || th_usable_size(p) < 100 || th_usable_size(q) < 5000) return 1;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL) return 3;
  for (int i = 0; i < 20000; i++) fputs("0123456789", f);
  if (fclose(f) != 0 || len != 200000 || th_usable_size(buf) < len) return 4;
  free(buf);
  strcpy(p, "installed");
  th_stats_t s;
  th_stats_get(&s);
  if (s.committed == 0) return 2;
  printf("%s %d.%d\n", p, TH_VERSION_MAJOR, TH_VERSION_MINOR);
  free(p);
  th_free(q);
  return 0;
}
EOF

# pkg-config, shared library.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
check "pkg-config build" sh -c "cc -o '$tmp/prog_pc' '$tmp/prog.c' \$(pkg-config --cflags --libs threadheap)"
check "pkg-config program runs" env LD_LIBRARY_PATH="$libdir" "$tmp/prog_pc"
check "pkg-config program uses the installed library" \
  sh -c "LD_LIBRARY_PATH='$libdir' ldd '$tmp/prog_pc' | grep -q '$libdir/libthreadheap.so'"
# With only the static library in a folder of its own, -lthreadheap can only be the archive.
mkdir -p "$tmp/static/pkgconfig"
cp "$libdir/libthreadheap.a" "$tmp/static/"
sed -e "s|^prefix=.*|prefix=$prefix|" -e "s|^libdir=.*|libdir=$tmp/static|" "$libdir/pkgconfig/threadheap.pc" \
  >"$tmp/static/pkgconfig/threadheap.pc"
check "pkg-config --static build" sh -c "PKG_CONFIG_PATH='$tmp/static/pkgconfig' && export PKG_CONFIG_PATH && \
  cc -o '$tmp/prog_pcs' '$tmp/prog.c' \$(pkg-config --static --cflags --libs threadheap)"
check "pkg-config static program has no libthreadheap.so" \
  sh -c "test -x '$tmp/prog_pcs' && ! ldd '$tmp/prog_pcs' | grep -q libthreadheap"
check "pkg-config static program runs" "$tmp/prog_pcs"

# find_package(threadheap): the shared and the static target.
mkdir -p "$tmp/proj"
cp "$tmp/prog.c" "$tmp/proj/prog.c"
cat >"$tmp/proj/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(uses_threadheap C)
find_package(threadheap 0.1 REQUIRED)
add_executable(prog_shared prog.c)
target_link_libraries(prog_shared PRIVATE threadheap::threadheap)
add_executable(prog_static prog.c)
target_link_libraries(prog_static PRIVATE threadheap::threadheap_static)
EOF
check "find_package configure" cmake -S "$tmp/proj" -B "$tmp/proj/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix"
check "find_package build" cmake --build "$tmp/proj/build"
check "find_package shared program runs" "$tmp/proj/build/prog_shared"
check "find_package shared program uses the installed library" \
  sh -c "ldd '$tmp/proj/build/prog_shared' | grep -q '$libdir/libthreadheap.so'"
check "find_package static program runs" "$tmp/proj/build/prog_static"
check "find_package static program has no libthreadheap.so" \
  sh -c "test -x '$tmp/proj/build/prog_static' && ! ldd '$tmp/proj/build/prog_static' | grep -q libthreadheap"

# The installed command, from a folder outside the source and build trees.
cd "$tmp" || exit 1
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
