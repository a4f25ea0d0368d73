#!/usr/bin/env bash
# Sparse decode in the whole stack, real processes, on small models
# made by mkmodel: in every FFN mode a stack allows (dense, gate-first,
# predictor), with 2 cpu-workers and with 1, `pi2 run`'s greedy text is
# byte-identical to pi2-ref's in the same mode; `pi2 up`'s auto mode is the
# expected one; modes a stack cannot run are refused naming the reason and the
# stack goes on serving; `pi2 up` refuses a mode or predictor the model cannot
# take and leaves nothing; kill -9 of a cpu-worker mid-generation in gate-first
# and predictor mode changes nothing; nothing is left behind.
set -u
cd "$(dirname "$0")/.." || exit 1
RUN_BASE="tss$$"
# shellcheck source=tests/sh/stack_common.sh
. tests/sh/stack_common.sh

require_programs pi2 pi2-ref mkmodel pi2-predictor cachemgr io-worker coordinator npu-worker cpu-worker pi2-ctl pi2-client

# The generated text may hold any byte (random models, byte tokens), NUL
# included: it is compared as files, never through $(...).
gen() { # gen OUT RUN PROMPT N [flags]: the stack's text into OUT, client errors in $TMP/gen.err
    local out=$1 run=$2 prompt=$3 n=$4
    shift 4
    timeout 120 "$PI2" run -r "$run" -p "$prompt" -n "$n" "$@" >"$out" 2>"$TMP/gen.err"
}

ref() { # ref OUT MODEL PROMPT N [flags]
    local out=$1 model=$2 prompt=$3 n=$4
    shift 4
    "$REF" -m "$model" -p "$prompt" -n "$n" -c 512 -t 2 "$@" >"$out" 2>"$TMP/ref.err"
}

# same NAME EXPECTED-FILE GOT-FILE [RUN]: byte-identical text, with the logs when not
same() {
    if [ -s "$2" ] && cmp -s "$2" "$3"; then
        check "$1" 0
    else
        check "$1" 1
        echo "expected: $(cat -v "$2")"
        echo "got:      $(cat -v "$3")"
        sed 's/^/client: /' "$TMP/gen.err" | tail -n 5
        [ -n "${4:-}" ] && dump_logs "$4"
    fi
}

# last_session_mode RUN: the FFN mode of the coordinator's latest session
last_session_mode() {
    "$PI2" logs coordinator -r "$1" 2>/dev/null | grep -E 'session [0-9]+ for ' | tail -n 1 | sed -n 's/.*, ffn \([a-z-]*\)$/\1/p'
}

# stack_mode RUN: the mode cachemgr says the stack was started in
stack_mode() {
    "$PI2" logs cachemgr -r "$1" 2>/dev/null | sed -n 's/.*FFN mode of the stack: \([a-z-]*\).*/\1/p' | tail -n 1
}

# built_rows RUN PROC: how many times PROC logged building neuron-major down rows
built_rows() { "$PI2" logs "$2" -r "$1" 2>/dev/null | grep -c 'built neuron-major down rows'; }

cpu_workers() { # cpu_workers CONF: the cpu-worker names of a config
    local i=0 line
    while read -r line; do
        case $line in cpu-worker*) echo "cpu-worker.$i"; i=$((i + 1)) ;; esac
    done <"$1"
}

# ---- the models: small, made here in seconds ----
# The seeds are picked so that on the prompt below the modes give different
# texts in pi2-ref (gate-first requantizes a Q4_0 down into Q8_0 rows; the
# predictors miss neurons): a stack that ran the wrong mode shows.
M_GGUF=$TMP/relu-q4_0.gguf   # ReLU GGUF, no ffn_down_t: workers build their rows
M_PWRI=$TMP/relu-pwri.gguf   # PowerInfer file: ffn_down_t, fc1/fc2 predictor
M_Q8=$TMP/relu-q8_0.gguf     # ReLU GGUF with a lowrank predictor side file
P_Q8=$TMP/relu-q8_0.pred.gguf
M_OTHER=$TMP/other-q8_0.gguf # same shape as M_Q8, other weights
P_OTHER=$TMP/other-q8_0.pred.gguf
M_SILU=$TMP/silu.gguf
mk() { "$BIN/mkmodel" --preset tiny "$@" >>"$TMP/mk.log" 2>&1; }
mk -o "$M_GGUF" --act relu --type q4_0 --layers 4 --seed 3 &&
    mk -o "$M_PWRI" --act relu --type q4_0 --pwri --seed 3 &&
    mk -o "$M_Q8" --act relu --type q8_0 --layers 4 --seed 5 &&
    mk -o "$M_OTHER" --act relu --type q8_0 --layers 4 --seed 6 &&
    mk -o "$M_SILU" --act silu --type q4_0 --layers 4 --seed 1
check "mkmodel makes the ReLU GGUF, PWRI, Q8_0 and SiLU models" $?
pred_build() { "$BIN/pi2-predictor" build -m "$1" -o "$2" -n 32 --gen 4 --recall 0.9 >>"$TMP/mk.log" 2>&1; }
pred_build "$M_Q8" "$P_Q8" && pred_build "$M_OTHER" "$P_OTHER"
check "pi2-predictor build makes the side files" $?
if ((fail)); then
    tail -n 20 "$TMP/mk.log"
    exit 1
fi

PROMPT="Once upon a time, there was a little girl"
N=24

# ---- every ReLU model x {2 cpu-workers, 1 cpu-worker} x every mode the stack allows ----
# run_case NAME MODEL AUTO-MODE ALLOWED-MODES REFUSED-MODE BUILDS-ROWS(1/0) SPARSE-DIFFERS [up/ref args...]
# SPARSE-DIFFERS: the modes whose pi2-ref text should differ from dense here
# (gate-first is exact on ffn_down_t and on Q8_0 rows); only a note if not
run_case() {
    local name=$1 model=$2 auto=$3 modes=$4 refused=$5 builds=$6 differs=$7
    shift 7
    local extra=("$@") mode variant R w ok
    for mode in $modes; do
        ref "$TMP/want.$name.$mode" "$model" "$PROMPT" $N --temp 0 "${extra[@]}" --ffn $mode
        [ -s "$TMP/want.$name.$mode" ]; check "$name: pi2-ref --ffn $mode gives text" $?
    done
    for mode in $differs; do
        cmp -s "$TMP/want.$name.dense" "$TMP/want.$name.$mode" &&
            echo "note: $name: pi2-ref's $mode text equals its dense text (the comparison cannot tell them apart)"
    done
    for variant in two one; do
        new_run R
        up "$R" "$TMP/$variant.conf" "$model" "${extra[@]}"
        check "$name/$variant: pi2 up (auto mode)" $?
        [ "$(stack_mode "$R")" = "$auto" ]
        check "$name/$variant: cachemgr says the stack's mode is $auto (got '$(stack_mode "$R")')" $?
        "$PI2" status -r "$R" | grep -q "^ffn $auto"
        check "$name/$variant: pi2 status shows the stack's mode $auto" $?
        ok=0
        for w in $(cpu_workers "$TMP/$variant.conf"); do
            if ((builds)); then [ "$(built_rows "$R" $w)" -ge 1 ] || ok=1; else [ "$(built_rows "$R" $w)" -eq 0 ] || ok=1; fi
        done
        check "$name/$variant: each cpu-worker built its neuron-major down rows: $( ((builds)) && echo yes || echo 'no (the file has them)')" $ok

        gen "$TMP/got" "$R" "$PROMPT" $N --temp 0
        same "$name/$variant: pi2 run (auto) == pi2-ref --ffn $auto" "$TMP/want.$name.$auto" "$TMP/got" "$R"
        [ "$(last_session_mode "$R")" = "$auto" ]
        check "$name/$variant: the coordinator ran the session in mode $auto" $?
        for mode in $modes; do
            gen "$TMP/got" "$R" "$PROMPT" $N --temp 0 --ffn $mode
            same "$name/$variant: pi2 run --ffn $mode == pi2-ref --ffn $mode" "$TMP/want.$name.$mode" "$TMP/got" "$R"
            [ "$(last_session_mode "$R")" = "$mode" ]
            check "$name/$variant: the coordinator ran --ffn $mode in mode $mode" $?
        done
        gen "$TMP/got" "$R" "$PROMPT" $N --temp 0 --dense
        same "$name/$variant: pi2 run --dense == pi2-ref dense" "$TMP/want.$name.dense" "$TMP/got" "$R"
        [ "$(last_session_mode "$R")" = dense ]
        check "$name/$variant: the coordinator ran --dense in mode dense" $?
        if [ -n "$refused" ]; then
            gen "$TMP/got" "$R" "$PROMPT" $N --temp 0 --ffn "$refused"
            local rc=$?
            [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "$refused" "$TMP/gen.err"
            check "$name/$variant: pi2 run --ffn $refused is refused naming it (rc $rc)" $?
            sed 's/^/client: /' "$TMP/gen.err" | tail -n 1
            gen "$TMP/got" "$R" "$PROMPT" $N --temp 0
            same "$name/$variant: after the refusal the stack still serves (== pi2-ref --ffn $auto)" \
                "$TMP/want.$name.$auto" "$TMP/got" "$R"
        fi
        "$PI2" down -r "$R" >/dev/null 2>&1 && no_leftovers "$R"
        check "$name/$variant: pi2 down leaves nothing" $?
    done
}
run_case gguf "$M_GGUF" gate-first "dense gate-first" predictor 1 gate-first
run_case pwri "$M_PWRI" predictor "dense gate-first predictor" "" 0 predictor
run_case q8-side "$M_Q8" predictor "dense gate-first predictor" "" 1 predictor --predictor "$P_Q8"

# ---- stacks started dense, and the SiLU model ----
# refused_run NAME RUN MODE REASON-REGEX: pi2 run --ffn MODE fails naming REASON
refused_run() {
    gen "$TMP/got" "$2" "$PROMPT" $N --temp 0 --ffn "$3"
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -Eq "$4" "$TMP/gen.err"
    check "$1: pi2 run --ffn $3 is refused: $4 (rc $rc)" $?
}
new_run R
up "$R" "$TMP/two.conf" "$M_GGUF" --ffn dense
check "gguf: pi2 up --ffn dense" $?
[ "$(stack_mode "$R")" = dense ] && [ "$(built_rows "$R" cpu-worker.0)" -eq 0 ]
check "gguf dense stack: mode dense, no neuron-major rows built" $?
gen "$TMP/got" "$R" "$PROMPT" $N --temp 0
same "gguf dense stack: pi2 run == pi2-ref dense" "$TMP/want.gguf.dense" "$TMP/got" "$R"
refused_run "gguf dense stack" "$R" gate-first 'gate-first.*(dense|down rows)'
refused_run "gguf dense stack" "$R" predictor predictor
"$PI2" down -r "$R" >/dev/null 2>&1

new_run R
up "$R" "$TMP/two.conf" "$M_PWRI" --ffn dense
check "pwri: pi2 up --ffn dense" $?
gen "$TMP/got" "$R" "$PROMPT" $N --temp 0
same "pwri dense stack: pi2 run == pi2-ref dense" "$TMP/want.pwri.dense" "$TMP/got" "$R"
gen "$TMP/got" "$R" "$PROMPT" $N --temp 0 --ffn gate-first
same "pwri dense stack: gate-first allowed (the file has ffn_down_t), == pi2-ref" "$TMP/want.pwri.gate-first" "$TMP/got" "$R"
refused_run "pwri dense stack" "$R" predictor predictor
"$PI2" down -r "$R" >/dev/null 2>&1

ref "$TMP/want.silu" "$M_SILU" "$PROMPT" $N --temp 0
new_run R
up "$R" "$TMP/two.conf" "$M_SILU"
check "silu: pi2 up (auto mode)" $?
[ "$(stack_mode "$R")" = dense ]
check "silu: the auto mode of a SiLU model is dense" $?
gen "$TMP/got" "$R" "$PROMPT" $N --temp 0
same "silu: pi2 run == pi2-ref" "$TMP/want.silu" "$TMP/got" "$R"
[ "$(last_session_mode "$R")" = dense ]
check "silu: the coordinator ran the session dense" $?
refused_run "silu" "$R" gate-first 'gate-first.*ReLU'
gen "$TMP/got" "$R" "$PROMPT" $N --temp 0
same "silu: after the refusal the stack still serves" "$TMP/want.silu" "$TMP/got" "$R"
"$PI2" down -r "$R" >/dev/null 2>&1

# ---- pi2 up refuses a mode or predictor the model cannot take ----
# bad_up NAME REGEX MODEL ARGS...: fails at once (not at --timeout), the
# message matches REGEX, nothing is left
bad_up() {
    local name=$1 want=$2 model=$3 run t0 t1 rc
    shift 3
    new_run run
    t0=$(date +%s)
    "$PI2" up -m "$model" -c "$TMP/two.conf" -r "$run" --ctx 512 --timeout 8 "$@" >"$TMP/bad.out" 2>&1
    rc=$?
    t1=$(date +%s)
    [ $rc -ne 0 ] && grep -Eq "$want" "$TMP/bad.out" && no_leftovers "$run"
    local ok=$?
    check "pi2 up $name: refused, the reason named, nothing left" $ok
    [ $ok -eq 0 ] || tail -n 5 "$TMP/bad.out"
    [ $((t1 - t0)) -lt 5 ]
    check "pi2 up $name: refused at once ($((t1 - t0)) s; --timeout 8)" $?
}
bad_up "--ffn gate-first on a SiLU model" 'gate-first.*ReLU' "$M_SILU" --ffn gate-first
bad_up "--predictor built for another model" "$P_OTHER.*(another|other) model" "$M_Q8" --predictor "$P_OTHER"

# ---- a slow worker: the others take its FFN chunks ----
# PI2_CHUNK_DELAY makes cpu-worker.1 sleep after each batch of its own chunks,
# so cpu-worker.0 runs out first and takes the rest from cpu-worker.1's queue
# (the PWRI file's rows are shared). Who computed a chunk must not change a bit.
# The sleep must outweigh a batch's compute for the split to see it: under
# qemu a batch computes some ten times slower, and 300 us left the split even.
delay=300
emulated && delay=3000
new_run R
PI2_CHUNK_DELAY=1:$delay up "$R" "$TMP/two.conf" "$M_PWRI"
check "pwri slow-worker stack: pi2 up with PI2_CHUNK_DELAY=1:$delay" $?
for mode in predictor gate-first dense; do
    gen "$TMP/got" "$R" "$PROMPT" $N --temp 0 --ffn $mode
    same "pwri slow worker: pi2 run --ffn $mode == pi2-ref --ffn $mode" "$TMP/want.pwri.$mode" "$TMP/got" "$R"
done
"$PI2" logs cpu-worker.0 -r "$R" 2>/dev/null | grep -q "took layer [0-9]*'s chunk [0-9]* from cpu-worker.1"
check "pwri slow worker: cpu-worker.0 took chunks from cpu-worker.1's queue" $?
# the balanced split (the default) measured cpu-worker.1 slow and gave it less of every step
split=$("$PI2" logs coordinator -r "$R" 2>/dev/null | grep 'decode split (balanced)' | tail -n 1)
share1=$(sed -n 's/.*cpu-worker\.1 \([0-9.]*\) %.*/\1/p' <<<"$split")
awk -v s="$share1" 'BEGIN { exit !(s != "" && s + 0 < 40) }'
check "pwri slow worker: the balanced split gave cpu-worker.1 under 40 % (${split#*INFO})" $?
"$PI2" down -r "$R" >/dev/null 2>&1 && no_leftovers "$R"
check "pwri slow-worker stack: pi2 down leaves nothing" $?

# ---- a fixed uneven split (stack config split=1,3): who computes what changes no bit ----
{ cat "$TMP/two.conf"; echo split=1,3; } >"$TMP/skew.conf"
skew_case() { # skew_case NAME MODEL MODES...
    local name=$1 model=$2 mode
    shift 2
    new_run R
    up "$R" "$TMP/skew.conf" "$model"
    check "$name split 1,3: pi2 up" $?
    for mode in "$@"; do
        gen "$TMP/got" "$R" "$PROMPT" $N --temp 0 --ffn $mode
        same "$name split 1,3: pi2 run --ffn $mode == pi2-ref --ffn $mode" "$TMP/want.$name.$mode" "$TMP/got" "$R"
    done
    "$PI2" logs coordinator -r "$R" 2>/dev/null | grep -q 'decode split (fixed): cpu-worker.0 25.0 %, cpu-worker.1 75.0 %'
    check "$name split 1,3: the coordinator split the steps 25 / 75" $?
    "$PI2" status -r "$R" 2>/dev/null | grep -q '^decode split (fixed): cpu-worker.0 25.0 %, cpu-worker.1 75.0 %$'
    check "$name split 1,3: pi2 status shows the split" $?
    "$PI2" down -r "$R" >/dev/null 2>&1 && no_leftovers "$R"
    check "$name split 1,3: pi2 down leaves nothing" $?
}
skew_case pwri "$M_PWRI" predictor gate-first dense
skew_case gguf "$M_GGUF" gate-first dense

# ---- kill -9 of a cpu-worker mid-generation in sparse mode ----
# Every task of the workers sleeps PI2_TASK_DELAY_US, so a generation lasts
# seconds and the kill lands in the middle of it.
export PI2_TASK_DELAY_US=${PI2_TEST_TASK_DELAY_US:-20000}
FAULT_N=32
# kill_mid NAME RUN MODEL MODE [ref args]: kill -9 cpu-worker.1 in the decode
# of a --ffn MODE generation (once the client printed a few generated bytes);
# the output is unchanged, the worker comes back and serves the next generation
kill_mid() {
    local name=$1 run=$2 model=$3 mode=$4 rd victim rc rows_before
    shift 4
    rd=$("$PI2" rundir -r "$run")
    ref "$TMP/want.fault" "$model" "$PROMPT" $FAULT_N --temp 0 "$@" --ffn "$mode"
    victim=$(cat "$rd/cpu-worker.1.pid")
    rows_before=$(built_rows "$run" cpu-worker.1)
    rm -f "$TMP/got"
    gen "$TMP/got" "$run" "$PROMPT" $FAULT_N --temp 0 --ffn "$mode" &
    local client=$!
    for _ in $(seq 200); do
        [ "$(stat -c %s "$TMP/got" 2>/dev/null || echo 0)" -ge $((${#PROMPT} + 6)) ] && break
        sleep 0.05
    done
    kill -0 "$client" 2>/dev/null
    check "$name: the generation is still running when cpu-worker.1 is killed" $?
    kill -9 "$victim"
    wait "$client"
    rc=$?
    check "$name: cpu-worker.1 killed: the client succeeds" $rc
    same "$name: cpu-worker.1 killed mid-generation: output == pi2-ref --ffn $mode" "$TMP/want.fault" "$TMP/got" "$run"
    restarted "$rd" cpu-worker.1 "$victim"
    check "$name: the supervisor restarted cpu-worker.1" $?
    if ((rows_before)); then
        [ "$(built_rows "$run" cpu-worker.1)" -gt "$rows_before" ]
        check "$name: the new cpu-worker.1 rebuilt its neuron-major down rows" $?
    fi
    gen "$TMP/got" "$run" "$PROMPT" $FAULT_N --temp 0 --ffn "$mode"
    same "$name: after the restart, a new generation == pi2-ref --ffn $mode" "$TMP/want.fault" "$TMP/got" "$run"
}
new_run R
up "$R" "$TMP/two.conf" "$M_GGUF"
check "gguf fault stack: pi2 up with PI2_TASK_DELAY_US=$PI2_TASK_DELAY_US" $?
kill_mid "gguf gate-first" "$R" "$M_GGUF" gate-first
"$PI2" down -r "$R" >/dev/null 2>&1 && no_leftovers "$R"
check "gguf fault stack: pi2 down leaves nothing" $?

new_run R
up "$R" "$TMP/two.conf" "$M_PWRI"
check "pwri fault stack: pi2 up with PI2_TASK_DELAY_US=$PI2_TASK_DELAY_US" $?
kill_mid "pwri predictor" "$R" "$M_PWRI" predictor
"$PI2" down -r "$R" >/dev/null 2>&1 && no_leftovers "$R"
check "pwri fault stack: pi2 down leaves nothing" $?
unset PI2_TASK_DELAY_US

finish
[ $fail -eq 0 ]
