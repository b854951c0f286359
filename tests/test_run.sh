#!/bin/sh
# test_run.sh BUILD_DIR: `threadheap run` from the build tree (BUILD_DIR/bin/threadheap): exit status and
# signals passed through, --stats for the named process only, the library preloaded ahead of an existing
# LD_PRELOAD, SIGPIPE back to its default, and one-line errors.
set -u
th=${1:?usage: test_run.sh BUILD_DIR}/bin/threadheap
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
unset TH_LIB LD_PRELOAD THREADHEAP_SHOW_STATS THREADHEAP_STATS_PID THREADHEAP_STATS_FILE THREADHEAP_VERBOSE
export XDG_CACHE_HOME="$tmp/cache" # --stats calibrates the fault cost there, not in the user's ~/.cache
pass=0
fail=0
expect() { # expect NAME WANT GOT [OUTPUT FILE]
  if [ "$2" = "$3" ]; then
    pass=$((pass + 1))
  else
    echo "FAIL $1: expected '$2', got '$3'"
    [ $# -ge 4 ] && head -20 "$4"
    fail=$((fail + 1))
  fi
}

"$th" run -- sh -c 'exit 7' 2>"$tmp/err"
expect "exit status" 7 $?
"$th" run --stats -- sh -c 'exit 9' 2>"$tmp/err"
expect "exit status with --stats" 9 $?
"$th" run -- sh -c 'kill -TERM $$' 2>"$tmp/err"
expect "killed by SIGTERM" 143 $? "$tmp/err"
"$th" run --stats -- sh -c 'kill -KILL $$' 2>"$tmp/err"
expect "killed by SIGKILL, --stats" 137 $? "$tmp/err"
expect "--stats names the signal" 1 "$(grep -c 'was killed by signal 9 (SIGKILL)' "$tmp/err")" "$tmp/err"

# SIGTERM sent to `threadheap run --stats` goes on to the program, and the report still comes out.
"$th" run --stats -- sleep 60 2>"$tmp/err" &
runner=$!
i=0
while [ -z "$(pgrep -P "$runner" -x sleep)" ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
child=$(pgrep -P "$runner" -x sleep)
kill -TERM "$runner"
wait "$runner"
expect "SIGTERM forwarded: status" 143 $? "$tmp/err"
expect "SIGTERM forwarded: the program got it" 1 "$(grep -c 'was killed by signal 15 (SIGTERM)' "$tmp/err")" "$tmp/err"
[ -n "$child" ] && kill -0 "$child" 2>/dev/null && { echo "FAIL sleep still runs"; fail=$((fail + 1)); kill "$child"; }

# --stats reports the named process, a bash that allocates little, not its python3 child, which holds
# 64 MiB at once: the child inherits the environment but not the right to print.
"$th" run --stats -- bash -c 'python3 -c "x = [bytearray(1 << 20) for i in range(64)]"; exit 0' 2>"$tmp/err"
expect "--stats exit status" 0 $? "$tmp/err"
peak=$(sed -n 's/.* committed_peak  *\([0-9.]* [KMG]*i*B\)\( .*\)*$/\1/p' "$tmp/err")
case $peak in
  *KiB | *" B" | [0-9].*MiB) pass=$((pass + 1)) ;;
  *) echo "FAIL --stats reports committed_peak '$peak', not bash's own (a few MiB at most)"
     head -30 "$tmp/err"; fail=$((fail + 1)) ;;
esac
for what in "minor page faults" "major page faults" "voluntary switches" "involuntary switches" \
  "user CPU" "system CPU" "peak RSS" "heaps_created"; do
  expect "--stats shows $what" 1 "$(grep -c "  $what  " "$tmp/err")" "$tmp/err"
done

# The library goes first in LD_PRELOAD; an existing preload stays after it.
other=$(cd "$(dirname "$th")/.." && pwd)/libthreadheap.so
LD_PRELOAD=$other "$th" run -- sh -c 'echo "$LD_PRELOAD"' >"$tmp/out" 2>&1
expect "LD_PRELOAD order" "$other:$other" "$(cat "$tmp/out")" "$tmp/out"

# Python ignores SIGPIPE; the program must get it back: yes then dies quietly when head exits.
"$th" run -- yes 2>"$tmp/err" | head -1 >/dev/null
expect "SIGPIPE restored (no error from yes)" 0 "$(wc -c <"$tmp/err")" "$tmp/err"

# Errors: one line each, with a shell's exit codes.
"$th" run -- no-such-program-here 2>"$tmp/err"
expect "missing program status" 127 $?
expect "missing program message" 1 "$(grep -c '^threadheap run: program not found: no-such-program-here$' "$tmp/err")" "$tmp/err"
"$th" run true 2>"$tmp/err"
expect "no -- status" 2 $?
expect "no -- message" 1 "$(grep -c "^threadheap run: missing '--'" "$tmp/err")" "$tmp/err"
TH_LIB=$tmp/nowhere.so "$th" run -- true 2>"$tmp/err"
expect "library not found status" 1 $?
expect "library not found message" 1 "$(grep -c '^threadheap run: library not found' "$tmp/err")" "$tmp/err"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
