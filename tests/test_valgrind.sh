#!/bin/sh
# test_valgrind.sh PROGRAM: runs test_valgrind_heap (built against the TH_VALGRIND library) under memcheck and
# checks that memcheck reports exactly the two errors the program makes on purpose, each in that file: a
# read after free of a th_heap_malloc block and a leaked one. Any other error is a false report caused by
# threadheap's own bookkeeping, and fails the test.
prog=$1
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
valgrind --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite --error-exitcode=0 \
  "$prog" >"$out" 2>&1
status=$?
passed=0 failed=0
check() { # check NAME PATTERN: the report has a line matching PATTERN (grep -E)
  if grep -Eq "$2" "$out"; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
check "the program ran to its end" "test_valgrind_heap: 0 wrong values"
[ "$status" = 0 ] || { echo "FAIL exit status $status"; failed=$((failed + 1)); }
check "read after free reported" "Invalid read of size 1"
check "... in read_after_free" "at 0x[0-9A-F]+: read_after_free \\(test_valgrind_heap.c"
check "... inside a freed block" "inside a block of size 200 free'd|bytes inside a recently re-allocated block|inside a block of size 200"
check "leak reported" "100 bytes in 1 blocks are definitely lost"
check "... allocated by th_heap_malloc in leak_one" "leak_one \\(test_valgrind_heap.c"
check "exactly two errors" "ERROR SUMMARY: 2 errors"
if [ "$failed" != 0 ]; then
  echo "--- memcheck said:"
  cat "$out"
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
