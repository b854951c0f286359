#!/bin/sh
# test_no_page_map.sh BINDIR: the library under an address-space limit (ulimit -v) too low for its page map
# (16 GiB of address space, segment.c). The OS refuses the map, a verbose line says so, and every free takes
# the checked path: the library's own tests, which verify what they allocate, must pass as they do without
# the limit (threads, remote frees, thread exit, fork, misuse reports, explicit heaps, huge blocks).
set -u
bin=${1:?usage: test_no_page_map.sh BINDIR}
limit_kb=8000000 # 7.6 GiB: room for the tests (one 3 GiB block), not for the map
unset THREADHEAP_VERBOSE LD_PRELOAD
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() {
  echo "FAIL $*"
  fail=$((fail + 1))
}
err=$(mktemp) || exit 1
trap 'rm -f "$err"' EXIT INT TERM

# The map refused: one verbose line naming the limit. Without the limit: no such line.
(ulimit -v $limit_kb && THREADHEAP_VERBOSE=1 "$bin/test_api" >/dev/null 2>"$err")
rc=$?
[ "$rc" = 0 ] && grep -q "^threadheap: the OS refused the page map's 16 GiB of address space (address-space limit: 7812 MiB)" "$err" &&
  ok || bad "verbose line under the limit: exit $rc, $(grep -c refused "$err") refused lines: $(head -c 400 "$err")"
THREADHEAP_VERBOSE=1 "$bin/test_api" >/dev/null 2>"$err"
rc=$?
[ "$rc" = 0 ] && ! grep -q "refused the page map" "$err" && ok || bad "no limit: exit $rc, $(head -c 400 "$err")"

for t in test_api test_churn test_misuse test_remote_batch test_remote_empty test_thread_churn test_exit_reuse \
  test_fork test_fork_stdio test_heap_threads test_heap_misuse test_large test_new "test_conformance --threadheap"; do
  # shellcheck disable=SC2086 # t is a command and its arguments
  (ulimit -v $limit_kb && exec timeout 120 "$bin"/$t) >/dev/null 2>"$err"
  rc=$?
  [ "$rc" = 0 ] && ok || bad "$t under ulimit -v $limit_kb: exit $rc: $(tail -3 "$err")"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
