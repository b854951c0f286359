#!/bin/sh
# test_startup.sh LIB STATIC_LIB_PROG PRELOAD_PROG LINKED_PROG DLOPEN_PROG: start-up, dlopen and two copies.
#   - prog_startup (allocation in .preinit_array, before threadheap's constructor, from threads that exist
#     before the first malloc; dlsym/dlerror; a static constructor; fork and exec) passes preloaded, linked to
#     the shared library, and linked to the static one; without the preload it must fail, so this cannot
#     pass with the library silently absent. Nothing may appear on stderr.
#   - prog_dlopen: threadheap dlopen'ed into a glibc-malloc program works as docs/usage.md documents.
#   - Two copies stop the process with one "threadheap: two copies ..." line and SIGABRT: the static copy
#     plus a preloaded one, and a preloaded copy plus a second file of the library loaded with dlopen.
set -u
lib=${1:?usage: test_startup.sh LIB STATIC PRELOAD LINKED DLOPEN}
static_prog=${2:?}
preload_prog=${3:?}
linked_prog=${4:?}
dlopen_prog=${5:?}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
pass=0
fail=0
unset THREADHEAP_SHOW_STATS THREADHEAP_VERBOSE

# ok NAME CMD...: CMD exits 0 with nothing on stderr.
ok() {
  name=$1
  shift
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ "$rc" = 0 ] && [ ! -s "$tmp/err" ]; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: exit $rc"
    head -5 "$tmp/err"
    fail=$((fail + 1))
  fi
}

# two_copies NAME CMD...: CMD is killed by SIGABRT after exactly one stderr line, the two-copies message.
two_copies() {
  name=$1
  shift
  ( ulimit -c 0; "$@" ) >"$tmp/out" 2>"$tmp/err"
  rc=$?
  want="threadheap: two copies of threadheap in one process (a static copy linked into the program and a shared one preloaded or loaded with dlopen); use one of them"
  if [ "$rc" = 134 ] && [ "$(cat "$tmp/err")" = "$want" ]; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: exit $rc (want 134, SIGABRT), stderr:"
    head -5 "$tmp/err"
    fail=$((fail + 1))
  fi
}

ok "preloaded program" env LD_PRELOAD="$lib" "$preload_prog"
ok "program linked to the shared library" "$linked_prog"
ok "program linked to the static library" "$static_prog"
if "$preload_prog" >/dev/null 2>&1; then
  echo "FAIL prog_startup passed without threadheap: it does not detect the allocator"
  fail=$((fail + 1))
else
  pass=$((pass + 1))
fi

ok "dlopen into a glibc program" "$dlopen_prog" "$lib"

two_copies "static copy + preloaded copy" env LD_PRELOAD="$lib" "$static_prog"
cp "$lib" "$tmp/libthreadheap-copy.so"
two_copies "preloaded copy + dlopen of a second file" env LD_PRELOAD="$lib" "$dlopen_prog" "$tmp/libthreadheap-copy.so"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
