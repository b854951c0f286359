# tests/check.sh: sourced by the shell tests (test_install.sh, test_deb.sh), which set $tmp (a scratch folder)
# and fail=0 first.
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
