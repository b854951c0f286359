#!/bin/sh
# test_preload.sh LIB PROG: threadheap as the process's malloc through LD_PRELOAD. Standard programs give
# the same output and exit status with and without it, and nothing extra on stderr; PROG (prog_override,
# not linked to threadheap) checks from the inside that malloc is threadheap's, and fails without the
# preload, so this cannot pass with the library silently not loaded.
set -u
lib=${1:?usage: test_preload.sh LIB PROG}
prog=${2:?usage: test_preload.sh LIB PROG}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
pass=0
fail=0
# Without THREADHEAP_SHOW_STATS and the like, which would add output of their own.
unset THREADHEAP_SHOW_STATS THREADHEAP_VERBOSE

# same NAME CMD...: runs CMD plain and preloaded; compares stdout, stderr and exit status.
same() {
  name=$1
  shift
  "$@" >"$tmp/out1" 2>"$tmp/err1"
  rc1=$?
  LD_PRELOAD="$lib" "$@" >"$tmp/out2" 2>"$tmp/err2"
  rc2=$?
  if [ "$rc1" = "$rc2" ] && cmp -s "$tmp/out1" "$tmp/out2" && cmp -s "$tmp/err1" "$tmp/err2"; then
    pass=$((pass + 1))
  else
    echo "FAIL $name: exit $rc1 plain, $rc2 preloaded"
    diff "$tmp/out1" "$tmp/out2" | head -5
    diff "$tmp/err1" "$tmp/err2" | head -5
    fail=$((fail + 1))
  fi
}

# Input for sort: 200,000 pseudo-random lines, generated without the allocator under test.
awk 'BEGIN { srand(7); for (i = 0; i < 200000; i++) printf "%08d %s\n", int(rand() * 1e8), i }' >"$tmp/lines"

same "ls -la /usr/bin" ls -la /usr/bin
same "sort" sort "$tmp/lines"
same "sort -n -r" sort -n -r "$tmp/lines"
same "sh -c pipeline" sh -c 'for i in 1 2 3 4 5; do echo "line $i"; done | tr a-z A-Z | wc -l; exit 3'
if command -v python3 >/dev/null 2>&1; then
  same "python3 threads" python3 -c '
import threading, hashlib
out = [None] * 8
def work(i):
    d = {}
    for k in range(20000):
        d[k] = ("%d-%d" % (i, k)) * (k % 7 + 1)
    out[i] = hashlib.sha256("".join(d[k] for k in range(0, 20000, 97)).encode()).hexdigest()
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print("\n".join(out))
'
fi

# prog_override: passes only with threadheap preloaded, with nothing on stderr.
if LD_PRELOAD="$lib" "$prog" >"$tmp/pout" 2>"$tmp/perr"; then
  if [ -s "$tmp/perr" ]; then
    echo "FAIL prog_override wrote to stderr:"
    head -5 "$tmp/perr"
    fail=$((fail + 1))
  else
    pass=$((pass + 1))
  fi
else
  echo "FAIL prog_override with LD_PRELOAD:"
  cat "$tmp/pout" "$tmp/perr" | head -20
  fail=$((fail + 1))
fi
if "$prog" >/dev/null 2>&1; then
  echo "FAIL prog_override passed without the preload: it does not detect threadheap"
  fail=$((fail + 1))
else
  pass=$((pass + 1))
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
