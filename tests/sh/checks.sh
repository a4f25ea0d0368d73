# shellcheck shell=bash
# Sourced by the shell tests: the counters and the check and skip that every
# suite counts with, and the closing line tests/run.sh sums.
pass=0 fail=0 skipped=0

check() { # check NAME STATUS
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; fi
}

skip() { # skip WHAT: a part this machine cannot run, counted and named (tests/run.sh names it once)
    skipped=$((skipped + 1))
    echo "SKIP $1"
}

checks_summary() { # the closing line; fails when a check failed
    echo "$pass passed, $fail failed, $skipped skipped"
    [ "$fail" -eq 0 ]
}
