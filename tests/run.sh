#!/usr/bin/env bash
# Runs every test binary in $BUILD/tests and every tests/*.sh script, each
# under a time limit (PI2_TEST_TIMEOUT seconds, default 1200); each ends with
# a line "N passed, N failed[, N skipped]" and may name what it skipped on
# lines "SKIP what". Prints what was skipped once, then the totals.
# PI2_TEST_WRAP: a command every test program, and every program of the build
# that a test starts, runs under (make test-arm64: qemu-aarch64).
# PI2_TESTS_SKIP="test_a test_b.sh ...": not run, each counted as one skip (what
# an emulator cannot run).
set -u
BUILD=${BUILD:-build}
LIMIT=${PI2_TEST_TIMEOUT:-1200}
export PI2_TEST_WRAP=${PI2_TEST_WRAP:-}
cd "$(dirname "$0")/.."
total_pass=0; total_fail=0; total_skip=0; broken=0
declare -A skipped_by=() # what was skipped -> the tests that skipped it
# false, and one skip counted and named, for a test in PI2_TESTS_SKIP
wanted() {
    [[ " ${PI2_TESTS_SKIP:-} " == *" $1 "* ]] || return 0
    local what="the whole test (PI2_TESTS_SKIP)"
    skipped_by[$what]="${skipped_by[$what]:+${skipped_by[$what]}, }$1"
    total_skip=$((total_skip + 1))
    return 1
}
run_one() {
    local name=$1; shift
    local out rc
    out=$(timeout --kill-after=10 "$LIMIT" "$@" 2>&1); rc=$?
    local line what
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' | tail -n 1)
    while IFS= read -r what; do
        [ -n "$what" ] && skipped_by[$what]="${skipped_by[$what]:+${skipped_by[$what]}, }$name"
    done < <(printf '%s\n' "$out" | sed -n 's/^SKIP //p' | sort -u)
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        printf '%s\n' "$out" | tail -n 20
        echo "BROKEN $name (stopped after its time limit of $LIMIT s)"
        broken=$((broken + 1)); total_fail=$((total_fail + 1)); return
    fi
    if [ -z "$line" ]; then
        printf '%s\n' "$out" | tail -n 20
        echo "BROKEN $name (exit $rc, no summary line)"
        broken=$((broken + 1)); total_fail=$((total_fail + 1)); return
    fi
    local p f k=0
    p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
    case $line in *skipped) k=${line##*failed, }; k=${k%% skipped} ;; esac
    total_skip=$((total_skip + k))
    if [ "$f" -gt 0 ] || [ $rc -ne 0 ]; then
        # each failure with the diagnostics a test prints after it
        printf '%s\n' "$out" | grep -E -A 15 'FAIL|ERROR|Sanitizer|runtime error' | head -n 120
        [ "$f" -eq 0 ] && f=1
    fi
    printf '%-28s %s\n' "$name" "$line"
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] && wanted "$(basename "$t")" || continue
    run_one "$(basename "$t")" $PI2_TEST_WRAP "$t"
done
for s in tests/*.sh; do
    [ "$(basename "$s")" = run.sh ] && continue
    [ -f "$s" ] && wanted "$(basename "$s")" || continue
    run_one "$(basename "$s")" env BUILD="$BUILD" bash "$s"
done
for what in "${!skipped_by[@]}"; do echo "skipped: $what, in ${skipped_by[$what]}"; done | sort
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
