#!/usr/bin/env bash
# make fuzz: builds the libFuzzer harnesses of tests/fuzz/ with clang
# (-fsanitize=fuzzer,address,undefined) into build-fuzz/, makes a seed corpus
# of valid inputs with the normal build (a micro model, its bundle file,
# profile and plan; the bus's messages from test_msg's), and runs each harness
# for FUZZ_SECONDS (default 60). Corpora stay in build-fuzz/corpus/NAME and grow
# from run to run; a crash leaves its input in build-fuzz/crash-NAME-* and
# fails the run. Ends with "N passed, N failed" (one check per harness).
#   tests/fuzz/run.sh [SECONDS]
set -u
cd "$(dirname "$0")/../.." || exit 1
SECONDS_EACH=${1:-${FUZZ_SECONDS:-60}}
BUILD=${BUILD:-build}
FB=build-fuzz
SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
make --no-print-directory -s BUILD=$FB CC=clang OPT=-O1 SAN="$SAN" PI2_IGNORE_DEPS=1 \
    $FB/libpi2.a $FB/planner.a >/dev/null || { echo "0 passed, 1 failed"; exit 1; }
pass=0; fail=0
mkdir -p $FB/corpus
# ---- seeds: valid inputs made by the normal build ----
S=$PWD/$FB/seeds # absolute: the planner ignores a relative XDG_CACHE_HOME (the XDG rule)
# made again on every run (a second or two): seeds of an older file format would only test refusals
rm -rf "$S" && mkdir -p "$S"/{gguf,bundle,profile,plan,hw_profile}
"$BUILD"/bin/mkmodel -o "$S/micro.pwri" --preset tiny --dim 32 --layers 1 --ff 64 --vocab 512 --heads 2 \
    --kv-heads 2 --act relu --pwri --seed 1 >/dev/null 2>&1
"$BUILD"/bin/mkmodel -o "$S/gguf/micro.gguf" --preset tiny --dim 32 --layers 1 --ff 64 --vocab 512 --heads 2 \
    --kv-heads 2 --act relu --seed 1 >/dev/null 2>&1
cp "$S/micro.pwri" "$S/gguf/"
XDG_CACHE_HOME=$S/cache "$BUILD"/bin/pi2 plan -m "$S/micro.pwri" --mem-budget 1G --hw-point-seconds 0.005 \
    -n 64 -o "$S/out" >/dev/null 2>&1
cp "$S/out/bundles.gguf" "$S/bundle/"
cp "$S/out/model-profile.gguf" "$S/profile/"
cp "$S/out/plan.pb" "$S/plan/"
# the message alone, behind an even byte: the harness frames it (fuzz_plan.c)
{ printf "\x00"; tail -c +9 "$S/out/plan.pb" | head -c -8; } >"$S/plan/body"
cp "$S"/cache/pi2/hw-*.txt "$S/hw_profile/"
rm -rf "$S/out" "$S/cache" "$S/micro.pwri"
# ---- the harnesses ----
for src in tests/fuzz/fuzz_*.c; do
    name=${src#tests/fuzz/fuzz_}; name=${name%.c}
    bin=$FB/fuzz/$name
    mkdir -p $FB/fuzz "$FB/corpus/$name"
    if ! clang -std=c11 -D_GNU_SOURCE -O1 -g -Ilib -I$FB/proto -fsanitize=fuzzer,address,undefined \
        -fno-omit-frame-pointer "$src" $FB/planner.a $FB/libpi2.a -lzmq -lprotobuf-c -luring -lm -pthread -o "$bin"; then
        echo "FAIL fuzz_$name: does not build"; fail=$((fail + 1)); continue
    fi
    seeds=()
    [ -d "$S/$name" ] && seeds=("$S/$name")
    log=$FB/fuzz-$name.log
    "$bin" -max_total_time="$SECONDS_EACH" -max_len=262144 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$FB/crash-$name-" "$FB/corpus/$name" "${seeds[@]}" >"$log" 2>&1
    rc=$?
    summary=$(grep -E '^#[0-9]+.*DONE|^Done [0-9]+ runs' "$log" | tail -n 2 | tr '\n' ' ')
    entries=$(find "$FB/corpus/$name" -type f | wc -l)
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1))
        echo "fuzz_$name: clean for ${SECONDS_EACH} s: $summary; corpus $entries entries"
    else
        fail=$((fail + 1))
        echo "FAIL fuzz_$name (exit $rc): see $log"
        grep -E -A 12 'ERROR|runtime error' "$log" | head -n 30
    fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
