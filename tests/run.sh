#!/usr/bin/env bash
# Runs every test binary in $BUILD/tests and every tests/*.sh script; each ends
# with a line "N passed, N failed". Prints the totals the same way.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
total_pass=0; total_fail=0; broken=0
run_one() {
    local name=$1; shift
    local out rc
    out=$("$@" 2>&1); rc=$?
    local line
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
        printf '%s\n' "$out" | tail -n 20
        echo "BROKEN $name (exit $rc, no summary line)"
        broken=$((broken + 1)); total_fail=$((total_fail + 1)); return
    fi
    local p f
    p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
    if [ "$f" -gt 0 ] || [ $rc -ne 0 ]; then
        # each failure with the diagnostics a test prints after it
        printf '%s\n' "$out" | grep -E -A 15 'FAIL|ERROR|Sanitizer|runtime error' | head -n 120
        [ "$f" -eq 0 ] && f=1
    fi
    printf '%-28s %s\n' "$name" "$line"
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for s in tests/*.sh; do
    [ "$(basename "$s")" = run.sh ] && continue
    [ -f "$s" ] || continue
    run_one "$(basename "$s")" env BUILD="$BUILD" bash "$s"
done
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
