#!/bin/sh
# test_stats_exit.sh LIB PROG: THREADHEAP_SHOW_STATS, THREADHEAP_STATS_PID, THREADHEAP_STATS_FILE and
# THREADHEAP_VERBOSE with the library preloaded into real programs. PROG is prog_exit_threads, which exits
# while its threads still allocate.
set -u
lib=${1:?usage: test_stats_exit.sh LIB PROG}
prog=${2:?usage: test_stats_exit.sh LIB PROG}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
unset THREADHEAP_SHOW_STATS THREADHEAP_STATS_PID THREADHEAP_STATS_FILE THREADHEAP_VERBOSE LD_PRELOAD
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() {
  echo "FAIL $*"
  fail=$((fail + 1))
}
# counter NAME FILE: the value of one counter line "threadheap: NAME VALUE" (the last one), or -1
counter() { awk -v n="$2" '$1 == "threadheap:" && $2 == n { v = $3 } END { print (v == "" ? -1 : v) }' "$1"; }
# lines FILE: how many processes printed their counters into FILE
lines() { grep -c '^threadheap: committed_peak ' "$1"; }

awk 'BEGIN { srand(3); for (i = 0; i < 50000; i++) printf "%08d %s\n", int(rand() * 1e8), i }' >"$tmp/in"

# No option: nothing on stderr.
LD_PRELOAD=$lib sort "$tmp/in" >/dev/null 2>"$tmp/err"
[ ! -s "$tmp/err" ] && ok || bad "without THREADHEAP_SHOW_STATS stderr is not empty: $(head -3 "$tmp/err")"

# SHOW_STATS: every counter on stderr at exit; sort allocated, so committed_peak is not zero.
LD_PRELOAD=$lib THREADHEAP_SHOW_STATS=1 sort "$tmp/in" >"$tmp/out" 2>"$tmp/err"
[ "$(grep -c '^threadheap: ' "$tmp/err")" -ge 17 ] && [ "$(counter "$tmp/err" committed_peak)" -gt 0 ] && ok ||
  bad "THREADHEAP_SHOW_STATS=1: $(head -3 "$tmp/err")"
sort "$tmp/in" | cmp -s - "$tmp/out" && ok || bad "THREADHEAP_SHOW_STATS=1 changed sort's output"

# STATS_FILE: the same lines in the file, nothing on stderr.
LD_PRELOAD=$lib THREADHEAP_SHOW_STATS=1 THREADHEAP_STATS_FILE=$tmp/stats sort "$tmp/in" >/dev/null 2>"$tmp/err"
[ ! -s "$tmp/err" ] && [ "$(counter "$tmp/stats" committed_peak)" -gt 0 ] && ok ||
  bad "THREADHEAP_STATS_FILE: stderr '$(head -2 "$tmp/err")', file '$(head -2 "$tmp/stats" 2>&1)'"
# A file that cannot be written: one line saying so, and the counters on stderr (from bash: sort closes
# stderr in its exit handler, and no copy of stderr is kept when a file is named).
LD_PRELOAD=$lib THREADHEAP_SHOW_STATS=1 THREADHEAP_STATS_FILE=$tmp/no/such/dir bash -c 'sort "$1"; exit 0' bash \
  "$tmp/in" >/dev/null 2>"$tmp/err"
grep -q "^threadheap: cannot write the statistics to $tmp/no/such/dir" "$tmp/err" &&
  [ "$(counter "$tmp/err" committed_peak)" -gt 0 ] && ok || bad "unwritable THREADHEAP_STATS_FILE: $(head -2 "$tmp/err")"

# STATS_PID: a bash that runs two sorts. Without it all three processes print; with the bash's own pid only
# the bash does (it execs in place of the sh, so $$ is its pid).
script='sort "$1" >/dev/null; sort "$1" >/dev/null; exit 0'
LD_PRELOAD=$lib THREADHEAP_SHOW_STATS=1 bash -c "$script" bash "$tmp/in" 2>"$tmp/err"
[ "$(lines "$tmp/err")" = 3 ] && ok || bad "without THREADHEAP_STATS_PID: $(lines "$tmp/err") processes printed, not 3"
sh -c 'LD_PRELOAD=$0 THREADHEAP_SHOW_STATS=1 THREADHEAP_STATS_PID=$$ exec bash -c "$1" bash "$2"' \
  "$lib" "$script" "$tmp/in" 2>"$tmp/err"
[ "$(lines "$tmp/err")" = 1 ] && ok || bad "THREADHEAP_STATS_PID=<bash>: $(lines "$tmp/err") processes printed, not 1"
LD_PRELOAD=$lib THREADHEAP_SHOW_STATS=1 THREADHEAP_STATS_PID=1 bash -c "$script" bash "$tmp/in" 2>"$tmp/err"
[ ! -s "$tmp/err" ] && ok || bad "THREADHEAP_STATS_PID=1: $(lines "$tmp/err") processes printed, not 0"

# Exit while four threads are allocating: the counters are printed, with every thread's heap counted, and
# the process exits 0 (timeout: a hang fails the test rather than stalling it).
THREADHEAP_SHOW_STATS=1 timeout 30 env LD_PRELOAD="$lib" "$prog" 2>"$tmp/err"
rc=$?
[ "$rc" = 0 ] && [ "$(counter "$tmp/err" heaps_created)" -ge 5 ] && ok ||
  bad "exit with threads allocating: exit $rc, heaps_created $(counter "$tmp/err" heaps_created)"

# VERBOSE: one start line with the version and the options in effect.
LD_PRELOAD=$lib THREADHEAP_VERBOSE=1 THREADHEAP_PURGE_DELAY=77 sort "$tmp/in" >/dev/null 2>"$tmp/err"
[ "$(grep -c '^threadheap: version .* PURGE_DELAY=77 ' "$tmp/err")" = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && ok ||
  bad "THREADHEAP_VERBOSE=1 start line: $(head -3 "$tmp/err")"
# VERBOSE and a map the OS refuses (address space limited to 300 MiB, a 2 GiB request): a line says so,
# and the program gets its MemoryError rather than a crash.
if command -v python3 >/dev/null 2>&1; then
  (ulimit -v 300000 && LD_PRELOAD=$lib THREADHEAP_VERBOSE=1 python3 -c '
try:
    bytearray(1 << 31)
except MemoryError:
    print("MemoryError")') >"$tmp/out" 2>"$tmp/err"
  grep -q '^threadheap: the OS refused to map' "$tmp/err" && grep -qx MemoryError "$tmp/out" && ok ||
    bad "THREADHEAP_VERBOSE=1 map failure: out '$(cat "$tmp/out")' err '$(head -3 "$tmp/err")'"
else
  echo "note: python3 not installed, map-failure message not checked"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
