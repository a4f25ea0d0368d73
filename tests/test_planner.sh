#!/usr/bin/env bash
# pi2 plan end to end on tiny mkmodel files (PWRI, predictor mode; GGUF, gate-first):
#   - it writes the plan, the bundle file, the model profile and the curve, and
#     `pi2 plan show` prints the plan (exit 0); the plan keeps within its budget;
#   - the prompt step: the largest of 512 / 256 / 128 tokens unless a smaller one
#     is predicted 3 % faster (from the logged predictions), named by plan show;
#     a stack config's max-prefill is kept;
#   - a budget under the model's floor is refused with the floor named; so is a
#     target speed the whole model in memory does not reach;
#   - -n past the calibration tokens the prompts give names the shortfall;
#   - --target-speed finds a budget whose prediction reaches it, and a budget
#     1 MiB smaller does not;
#   - a second run reuses the model profile and the bundle file; the same
#     inputs give the same plan and bundle file byte for byte;
#   - the hardware profile is cached (XDG_CACHE_HOME) and measured again on
#     --reprofile;
#   - a corrupted or truncated plan, and a plan of another model, are refused
#     by `pi2 plan show` / plan_load with the file named;
#   - a pi2-predictor side file plans a GGUF file in predictor mode; one of
#     another model is refused;
#   - the bundle order: on a file pi2-reorder made hottest-first the bundles
#     follow the file's neuron order (the pinned neurons a prefix of each
#     layer), as --order file asks of any file; --order profile orders them
#     by the calibration instead; both pin about as many bundles;
#   - bad arguments exit 2.
set -u
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=tests/sh/stack_common.sh
. tests/sh/stack_common.sh
require_programs pi2 planner mkmodel pi2-reorder gguf-info

export XDG_CACHE_HOME=$TMP/cache
PLAN=("$BIN/pi2" plan --hw-point-seconds 0.01)
"$BIN/mkmodel" -o "$TMP/m.pwri" --preset small --act relu --pwri --seed 3 >/dev/null 2>&1
"$BIN/mkmodel" -o "$TMP/m.gguf" --preset small --act relu --seed 3 >/dev/null 2>&1
"$BIN/mkmodel" -o "$TMP/other.pwri" --preset small --act relu --pwri --seed 4 >/dev/null 2>&1


"${PLAN[@]}" -m "$TMP/m.pwri" --mem-budget 150M -o "$TMP/p1" >"$TMP/p1.out" 2>"$TMP/p1.err"
check "pi2 plan (PWRI, predictor) exits 0" $?
for f in plan.pb bundles.gguf model-profile.gguf curve.svg; do
    [ -s "$TMP/p1/$f" ]; check "pi2 plan wrote $f" $?
done
grep -q "hardware profile: done" "$TMP/p1.err"; check "the first run measures the hardware" $?
grep -q "model profile: .*%" "$TMP/p1.err"; check "the model profile shows progress" $?
ls "$XDG_CACHE_HOME"/pi2/hw-*.txt >/dev/null 2>&1; check "the hardware profile is cached under XDG_CACHE_HOME" $?
grep -q "predictor mode" "$TMP/p1.out"; check "a PWRI file is planned in predictor mode" $?
grep -q "<svg" "$TMP/p1/curve.svg" && grep -q "plan: 150 MiB" "$TMP/p1/curve.svg"
check "curve.svg plots the curve with the plan's budget marked" $?

"$BIN/pi2" plan show "$TMP/p1/plan.pb" >"$TMP/show.out" 2>&1
check "pi2 plan show exits 0" $?
grep -q "memory budget      150.0 MiB" "$TMP/show.out"; check "plan show names the budget" $?
grep -q "<- plan" "$TMP/show.out"; check "plan show prints the curve with the plan's point" $?
# the parts within the budget (the loader checks it too; here from the printed figures)
awk '/^  (preloaded|processes|staging|hot|cold cache) / { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) { s += $i; break } }
     END { exit !(s > 0 && s <= 150 + 5 * 0.05) }  # each printed to 0.1' "$TMP/show.out"
check "the printed parts add up to no more than the budget" $?
# between prompts the prompt's buffers and staging hold more bundles: some, and no more than they are
awk '$1 == "lent" { l = $2 } $1 == "processes" { p = $2 } $1 == "staging" { s = $2 }
     END { exit !(l > 0 && l <= p + s + 0.1) }' "$TMP/show.out"
check "plan show lends the prompt's buffers and staging to bundles between prompts" $?

# the prompt step (max-prefill): without one in the stack config, the largest of 512, 256 and 128
# unless a smaller one is predicted 3 % faster, as the three predictions logged say; plan show names it
awk '/prompt steps of [0-9]+ tokens: predicted/ {
        for (i = 1; i <= NF; i++) { if ($i == "of") n = $(i + 1); if ($i == "predicted") t = $(i + 1) }
        k++; step[k] = n; tps[k] = t; if ($0 ~ /\(chosen\)/) chosen = n }
     END { if (k != 3 || step[1] != 512 || step[2] != 256 || step[3] != 128) exit 1
           best = 1; for (i = 2; i <= 3; i++) if (tps[i] > tps[best] * 1.03) best = i
           exit !(chosen == step[best]) }' "$TMP/p1.err"
check "the prompt step is the largest unless a smaller one is predicted 3 % faster" $?
chosen=$(sed -n 's/.*prompt steps of \([0-9]*\) tokens: .*(chosen).*/\1/p' "$TMP/p1.err")
grep -q "buffers for ${chosen:-none} tokens a step (max-prefill)" "$TMP/show.out"
check "plan show names the prompt step ($chosen tokens)" $?
printf 'cpu-worker cpus=0 threads=1\nmax-prefill=48\n' >"$TMP/step.conf"
"${PLAN[@]}" -m "$TMP/m.pwri" --mem-budget 150M -c "$TMP/step.conf" -o "$TMP/pstep" >/dev/null 2>"$TMP/pstep.err" &&
    "$BIN/pi2" plan show "$TMP/pstep/plan.pb" | grep -q "buffers for 48 tokens a step" &&
    ! grep -q "prompt steps of" "$TMP/pstep.err"
check "a stack config's max-prefill is the plan's prompt step" $?

# the floor
"${PLAN[@]}" -m "$TMP/m.pwri" --mem-budget 50M -o "$TMP/low" >/dev/null 2>"$TMP/low.err"
st=$?
[ $st -eq 1 ] && grep -q "this model needs at least .* GB .*; 0.05 GB was given" "$TMP/low.err"
check "a budget under the floor is refused with the floor named" $?
[ ! -e "$TMP/low/plan.pb" ]; check "no plan is written under the floor" $?
[ ! -e "$TMP/low/model-profile.gguf" ]; check "... and no profile is run for it (refused before the model profile)" $?

# calibration tokens: -n past what the prompts give is named, the default is not
"${PLAN[@]}" -m "$TMP/m.pwri" --mem-budget 150M -n 100000 -o "$TMP/many" >/dev/null 2>"$TMP/many.err"
st=$?
[ $st -eq 0 ] && grep -q "the prompts ran out at [0-9]* of the 100000 calibration tokens asked; -f FILE" "$TMP/many.err"
check "-n past what the prompts give: planned, the shortfall named" $?
! grep -q "ran out" "$TMP/p1.err"; check "the default -n says nothing of it" $?

# the target speed (half the in-memory prediction, whatever this machine measured): reached at the
# budget found, not 1 MiB below
resident=$(sed -n 's/^in memory *\([0-9.]*\) tok\/s.*/\1/p' "$TMP/show.out")
target=$(awk -v r="${resident:-0}" 'BEGIN { printf "%.2f", r / 2 }')
"${PLAN[@]}" -m "$TMP/m.pwri" --target-speed "$target" -o "$TMP/t" >"$TMP/t.out" 2>"$TMP/t.err"
check "--target-speed exits 0" $?
budget=$(sed -n 's/^memory budget *\([0-9.]*\) MiB.*/\1/p' "$TMP/t.out")
pred=$(sed -n 's/^predicted *\([0-9.]*\) tok\/s.*/\1/p' "$TMP/t.out")
awk -v p="$pred" -v t="$target" 'BEGIN { exit !(p >= t) }'
check "the budget found is predicted to reach the target $target ($pred tok/s at $budget MiB)" $?
below=$(awk -v b="$budget" 'BEGIN { printf "%d", b - 1 }')
"${PLAN[@]}" -m "$TMP/m.pwri" --mem-budget "${below}M" -o "$TMP/t2" >"$TMP/t2.out" 2>/dev/null
pred2=$(sed -n 's/^predicted *\([0-9.]*\) tok\/s.*/\1/p' "$TMP/t2.out")
awk -v p="${pred2:-0}" -v t="$target" 'BEGIN { exit !(p < t) }'; check "1 MiB less ($below MiB) is predicted under the target ($pred2 tok/s)" $?
"${PLAN[@]}" -m "$TMP/m.pwri" --target-speed 1000000 -o "$TMP/t3" >/dev/null 2>"$TMP/t3.err"
[ $? -eq 1 ] && grep -q "even with the whole model in memory" "$TMP/t3.err"
check "an unreachable target speed is refused" $?
"${PLAN[@]}" -m "$TMP/m.pwri" --target-speed "$target" --mem-budget "${below}M" -o "$TMP/t4" >/dev/null 2>"$TMP/t4.err"
[ $? -eq 1 ] && grep -q "more than --mem-budget" "$TMP/t4.err"
check "a target needing more than the given budget is refused" $?

# reuse and determinism
"${PLAN[@]}" -m "$TMP/m.pwri" --mem-budget 150M -o "$TMP/p1" >/dev/null 2>"$TMP/again.err"
grep -q "model profile: $TMP/p1/model-profile.gguf" "$TMP/again.err" && grep -q "bundle file: .*(unchanged)" "$TMP/again.err"
check "a second run reuses the model profile and the bundle file" $?
grep -q "hardware profile: $XDG_CACHE_HOME" "$TMP/again.err"; check "a second run uses the cached hardware profile" $?
cp "$TMP/p1/plan.pb" "$TMP/p1.plan"
"${PLAN[@]}" -m "$TMP/m.pwri" --mem-budget 150M -o "$TMP/p2" >/dev/null 2>&1
cmp -s "$TMP/p1/plan.pb" "$TMP/p2/plan.pb" && cmp -s "$TMP/p1/bundles.gguf" "$TMP/p2/bundles.gguf" &&
    cmp -s "$TMP/p1/model-profile.gguf" "$TMP/p2/model-profile.gguf"
check "the same inputs give the same plan, bundle file and profile byte for byte" $?
"${PLAN[@]}" -m "$TMP/m.pwri" --mem-budget 150M -o "$TMP/p3" --reprofile >/dev/null 2>"$TMP/re.err"
grep -q "hardware profile: done" "$TMP/re.err"; check "--reprofile measures the hardware again" $?

# gate-first on a GGUF file
"${PLAN[@]}" -m "$TMP/m.gguf" --mem-budget 50% -o "$TMP/g" >"$TMP/g.out" 2>"$TMP/g.err"
check "pi2 plan (GGUF, --mem-budget 50%) exits 0" $?
grep -q "gate-first mode" "$TMP/g.out" && grep -q "every gate row" "$TMP/g.out"
check "a GGUF file without a predictor is planned gate-first, gate rows preloaded" $?

# predictor mode on a GGUF file with a pi2-predictor side file
if "$BIN/pi2-predictor" build -m "$TMP/m.gguf" -o "$TMP/pred.gguf" >/dev/null 2>&1; then
    "${PLAN[@]}" -m "$TMP/m.gguf" --predictor "$TMP/pred.gguf" --mem-budget 50% -o "$TMP/gp" >"$TMP/gp.out" 2>&1
    grep -q "predictor mode" "$TMP/gp.out" && grep -q "^predictor      $TMP/pred.gguf" "$TMP/gp.out"
    check "--predictor FILE plans a GGUF file in predictor mode and records the side file" $?
    "${PLAN[@]}" -m "$TMP/other.pwri" --predictor "$TMP/pred.gguf" --mem-budget 50% -o "$TMP/gp2" >/dev/null 2>"$TMP/gp2.err"
    [ $? -eq 1 ]; check "a side file of another model is refused" $?
else
    check "pi2-predictor build for the side-file case" 1
fi

# bad plans
head -c 40 "$TMP/p1/plan.pb" >"$TMP/cut.pb"
"$BIN/pi2" plan show "$TMP/cut.pb" >/dev/null 2>"$TMP/cut.err"
[ $? -eq 1 ] && grep -q "$TMP/cut.pb" "$TMP/cut.err"; check "a truncated plan is refused with the file named" $?
cp "$TMP/p1/plan.pb" "$TMP/flip.pb"
printf '\x55' | dd of="$TMP/flip.pb" bs=1 seek=30 conv=notrunc status=none
"$BIN/pi2" plan show "$TMP/flip.pb" >/dev/null 2>"$TMP/flip.err"
[ $? -eq 1 ] && grep -q "checksum" "$TMP/flip.err"; check "a corrupted plan is refused (checksum)" $?

# the bundle order
order_of() { # the first 8 slots of the bundle file's order
    "$BIN/gguf-info" "$1/bundles.gguf" 2>/dev/null | sed -n 's/.*pi2.bundle.order = int32\[[0-9]*\] \[//p' |
        tr -c '0-9\n' ' ' | awk '{ print $1, $2, $3, $4, $5, $6, $7, $8 }'
}
pinned() { sed -n 's/^  hot .* \([0-9]*\) of [0-9]* bundles pinned.*/\1/p' "$1"; }
"$BIN/pi2-reorder" -m "$TMP/m.pwri" -o "$TMP/r.pwri" -n 64 --gen 8 >/dev/null 2>&1
check "pi2-reorder orders the small model hottest-first" $?
"${PLAN[@]}" -m "$TMP/r.pwri" --mem-budget 150M -o "$TMP/pr" >"$TMP/pr.out" 2>"$TMP/pr.err" &&
    grep -q "model file's neuron order (hottest-first, by pi2-reorder)" "$TMP/pr.err" &&
    [ "$(order_of "$TMP/pr")" = "0 1 2 3 4 5 6 7" ]
check "a hottest-first file: the bundles follow its neuron order ($(order_of "$TMP/pr"))" $?
"${PLAN[@]}" -m "$TMP/r.pwri" --order profile --mem-budget 150M -o "$TMP/pp" >"$TMP/pp.out" 2>"$TMP/pp.err" &&
    grep -q "^  hot " "$TMP/pp.out" && [ "$(order_of "$TMP/pp")" != "0 1 2 3 4 5 6 7" ]
check "--order profile: the calibration's order instead ($(order_of "$TMP/pp"))" $?
a=$(pinned "$TMP/pr.out") b=$(pinned "$TMP/pp.out")
[ -n "$a" ] && [ -n "$b" ] && [ "$a" -gt 0 ] && [ $((a * 10)) -ge $((b * 8)) ] && [ $((b * 10)) -ge $((a * 8)) ]
check "file and profile order pin about as many bundles ($a, $b)" $?
"${PLAN[@]}" -m "$TMP/m.pwri" --order file --mem-budget 150M -o "$TMP/pf" >/dev/null 2>"$TMP/pf.err" &&
    grep -q "model file's neuron order (--order file)" "$TMP/pf.err" && [ "$(order_of "$TMP/pf")" = "0 1 2 3 4 5 6 7" ]
check "--order file on any file: the file's neuron order" $?

# bad arguments
"$BIN/pi2" plan -m "$TMP/m.pwri" --order hot --mem-budget 1G -o "$TMP/x" >/dev/null 2>"$TMP/x.err"
[ $? -eq 2 ] && grep -q "profile or file" "$TMP/x.err"; check "a bad --order: exit 2, named" $?
"$BIN/pi2" plan -m "$TMP/m.pwri" -o "$TMP/x" >/dev/null 2>&1
[ $? -eq 2 ]; check "no budget and no target: exit 2" $?
"$BIN/pi2" plan -m "$TMP/m.pwri" --mem-budget 2X -o "$TMP/x" >/dev/null 2>"$TMP/x.err"
[ $? -eq 2 ] && grep -q "not a size" "$TMP/x.err"; check "a bad --mem-budget: exit 2, named" $?
"$BIN/pi2" plan -m "$TMP/missing.gguf" --mem-budget 1G -o "$TMP/x" >/dev/null 2>"$TMP/x.err"
[ $? -eq 1 ] && grep -q "missing.gguf" "$TMP/x.err"; check "a missing model: exit 1, named" $?
"$BIN/pi2" plan -h | grep -q "mem-budget"; check "pi2 plan -h prints the options" $?
