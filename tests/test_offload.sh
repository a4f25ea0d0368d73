#!/usr/bin/env bash
# A model larger than its memory budget (docs/offload.md), end to end on a
# PWRI file of 524 MiB whose FFN is most of it:
#   - pi2 plan at 100 %, 60 % and 50 % of the file, and `pi2 up --plan` of
#     each inside a cgroup v1 memory cap equal to the budget with a cold page
#     cache (when root): nothing is killed, nothing restarts, and the text of
#     a generation (prompt through the npu-worker's streamed prefill, decode
#     through the neuron cache) equals the unbudgeted stack's in predictor mode;
#     `pi2 status` shows each cpu-worker's neuron cache and the client's
#     timing line the generation's hit rate and MB read per token (more than
#     0 under 100 %); the unbudgeted stack shows neither;
#   - the pinned bundles in the prompt: on the model ordered hottest-first
#     (pi2-reorder), the 100 % plan's prompt copies a share of its FFN rows
#     from the pinned bundles instead of reading them, and the text equals
#     that model's unbudgeted stack's;
#   - lending (docs/offload.md, "Lending"): under 100 % the npu-worker reads
#     the plan's lent bundles into its idle prompt memory after each prompt,
#     and decode finds them there (more hits than with PI2_LEND=0, which
#     leaves them out, and the same text); the 50 % stack runs its fault
#     generations, each of which takes them back before its prompt, in its cap
#     without anything killed for memory; a prompt of several steps reads them
#     back once, after its last, and gives the unbudgeted text;
#   - priority: under a budget the io-worker's threads and the one thread of
#     each cpu-worker that carries its bundle requests run at SCHED_FIFO (when
#     root), no computing thread does; with realtime-io=off in the config none
#     does, and the text is the same;
#   - asking ahead: under a budget some reads are asked for before the
#     layer's attention (pi2 status ahead%), every layer step guesses its
#     misses, and none does under a plan that pins every bundle (the same
#     text); with PI2_PREFETCH=0 none are,
#     and the text is the same;
#   - reads by threads (PI2_IO_ENGINE=threads, as where io_uring is
#     refused): the misses are read that way and the text is the same;
#   - `pi2 up --mem-budget` under the floor is refused with the floor named;
#   - the plan's prompt step is the stack's when its config sets none, and a
#     config asking for more is refused;
#   - a GGUF file (ffn_down: the prompt streams whole layers) in gate-first mode
#     at 80 % in its cap gives the unbudgeted gate-first text;
#   - injected bundle read errors: a few are read again (same text), a
#     persistent one ends the generation with an error naming the bundle
#     file, never with other text;
#   - hostile batches written into a cpu-worker's bundle ring are refused and
#     the io-worker keeps serving; so is a read into the cold region (a packed
#     hot region's staging) once the weights are loaded;
#   - the io-worker, a cpu-worker, cachemgr killed with -9 while misses are in
#     flight: same text; a cpu-worker killed while it holds pins: its successor
#     lets them go (no slot pinned once the stack is idle).
set -u
cd "$(dirname "$0")/.." || exit 1
RUN_BASE="to$$"
# shellcheck source=tests/sh/stack_common.sh
. tests/sh/stack_common.sh
require_programs pi2 pi2-ctl pi2-garbage planner mkmodel cachemgr io-worker cpu-worker npu-worker coordinator

export XDG_CACHE_HOME=$TMP/cache
MODEL=$TMP/m.pwri
"$BIN/mkmodel" -o "$MODEL" --preset small --dim 1024 --ff 16384 --layers 16 --heads 16 --kv-heads 4 --vocab 512 \
    --ctx 128 --act relu --pwri --seed 5 >/dev/null 2>&1
check "mkmodel writes the test model" $?
# two.conf with the io-worker on the other core than cachemgr, short prompts, a short context
{ sed 's/^io-worker cpus=0$/io-worker cpus=1/' "$TMP/two.conf"; printf '%s\n' max-prefill=32 ctx=128; } >"$TMP/off.conf"
PROMPT="Once upon a time there was a little"
SIZE=$(stat -c %s "$MODEL")

in_cg() { # in_cg CG CMD...: CMD inside memory cgroup CG (none when CG is empty)
    local cg=$1
    shift
    if [ -n "$cg" ]; then bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "$@"; else "$@"; fi
}
generate() { # generate RUN OUT [CG]: pi2 run of the prompt into OUT (stderr OUT.err), inside CG; its status
    in_cg "${3:-}" "$PI2" run -r "$1" -p "$PROMPT" -n 24 --seed 1 >"$2" 2>"$2.err"
}

new_run R
"$PI2" up -r "$R" -c "$TMP/off.conf" -m "$MODEL" --ffn predictor >/dev/null 2>&1
check "the unbudgeted stack comes up (predictor mode)" $?
generate "$R" "$TMP/ref.txt"
check "the unbudgeted stack generates" $?
# a prompt of several max-prefill steps (32 tokens each)
LONG="$PROMPT girl who lived in a house by the sea. Every day she walked to the shore and looked at the boats.
She wanted to sail far away and see the world, but her mother said she was too young."
"$PI2" run -r "$R" -p "$LONG" -n 8 --seed 1 >"$TMP/ref-long.txt" 2>"$TMP/ref-long.err"
check "the unbudgeted stack generates after a prompt of several steps" $?
! grep -q "neuron cache" "$TMP/ref.txt.err" && ! "$PI2" status -r "$R" | grep -q "neuron cache"
check "the unbudgeted stack's timing line and pi2 status show no neuron cache" $?
"$PI2" down -r "$R" >/dev/null 2>&1

CG_ROOT=/sys/fs/cgroup/memory
can_cap=0
if ldd "$BIN/cachemgr" 2>/dev/null | grep -q libasan; then
    skip "memory caps under AddressSanitizer (its shadow memory is not the stack's; budgets run uncapped)"
elif emulated; then
    skip "memory caps under an emulator (qemu-user's own memory is counted; budgets run uncapped)"
elif [ "$(id -u)" = 0 ] && [ -w "$CG_ROOT" ]; then
    can_cap=1
else
    skip "memory caps (need root and cgroup v1 at $CG_ROOT; budgets run uncapped)"
fi

# cache_stats PCT RUN [noahead]: the client's timing line (in out-PCT[-noahead].txt.err) adds the
# generation's hit rate and MB read per token, `pi2 status` a row of numbers per cpu-worker (tokens,
# hot/cold/read %, the share of the reads asked for ahead, bundles, MB, per token, I/O wait %, ms per
# layer); under 100 % something was read, and (unless noahead) some of it asked for before attention
cache_stats() {
    local reads=1 ahead=1 what="at $1 %" out="$TMP/out-$1.txt.err"
    [ "$1" = 100 ] && reads=0
    if [ "${3:-}" = noahead ]; then ahead=0 what="at $1 % without asking ahead" out="$TMP/out-$1-noahead.txt.err"; fi
    sed -n 's/.*generated: [0-9]* tokens in [0-9.]* s .*; neuron cache: \([0-9.]*\)% hits, \([0-9.]*\) MB read per token$/\1 \2/p' \
        "$out" | awk -v reads=$reads '$1 >= 0 && $1 <= 100 && (!reads || $2 > 0) { ok = 1 } END { exit !ok }'
    check "$what: the client's timing line gives the hit rate and MB read per token" $?
    "$PI2" status -r "$2" | awk -v reads=$reads '$1 ~ /^cpu-worker\.[0-9]+:$/ && NF == 12 && $2 > 0 &&
        $3 + $4 + $5 > 99.8 && (!reads || ($7 > 0 && $8 > 0 && $10 > 0)) && $12 > 0 { n++ } END { exit n != 2 }'
    check "$what: pi2 status shows each cpu-worker's neuron cache" $?
    "$PI2" status -r "$2" | awk -v ahead=$((reads && ahead)) '$1 ~ /^cpu-worker\.[0-9]+:$/ && (ahead ? $6 > 0 : $6 == 0) {
        n++ } END { exit n != 2 }'
    check "$what: pi2 status shows $( ((reads && ahead)) && echo "reads asked for ahead" || echo "no read asked for ahead")" $?
}

policies() { # policies PROC RUN: the scheduling policy of each of PROC's threads, "comm policy" a line
    local pid t
    pid=$(cat "$("$PI2" rundir -r "$2")/$1.pid")
    for t in /proc/"$pid"/task/*; do
        echo "$(cat "$t/comm") $(chrt -p "${t##*/}" | sed -n '1s/.*: //p')"
    done
}
# check_priorities RUN ON: with ON=1 the io-worker's threads at SCHED_FIFO and, in each cpu-worker, some
# thread (libzmq's, for the io-worker's link) but not the computing ones; with ON=0 no thread of either
check_priorities() {
    local run=$1 on=$2 w ok=1
    if emulated; then
        skip "the I/O threads' real-time priority under an emulator (its own threads are the process's too)"
        return
    fi
    if ((on)); then
        policies io-worker "$run" | awk '$NF != "SCHED_FIFO" { bad = 1 } END { exit bad || NR == 0 }' || ok=0
        for w in 0 1; do
            policies "cpu-worker.$w" "$run" | awk '/^cpu-worker/ && $NF == "SCHED_FIFO" { bad = 1 } $NF == "SCHED_FIFO" { rt++ }
                END { exit bad || !rt }' || ok=0
        done
        check "$run: the io-worker's threads and each cpu-worker's link to it at SCHED_FIFO, no computing thread" $((!ok))
    else
        for w in io-worker cpu-worker.0 cpu-worker.1; do
            ! policies "$w" "$run" | grep -q SCHED_FIFO || ok=0
        done
        check "$run: realtime-io=off: no thread of the io-worker or the cpu-workers at SCHED_FIFO" $((!ok))
    fi
}

# plan_model DIR BUDGET: pi2 plan of the test model into DIR; the model's firing profile, which does not
# depend on the budget, is measured by its first plan and reused by the others (most of a plan's time, and
# under an emulator most of this suite's)
PROFILE=""
plan_model() {
    mkdir -p "$1"
    [ -n "$PROFILE" ] && ln -f "$PROFILE" "$1/model-profile.gguf"
    "$PI2" plan --hw-point-seconds 0.01 -n 64 --ctx 128 -c "$TMP/off.conf" -m "$MODEL" --mem-budget "$2" -o "$1"
    local rc=$?
    [ -n "$PROFILE" ] || [ ! -s "$1/model-profile.gguf" ] || PROFILE=$1/model-profile.gguf
    return $rc
}
# plan_errors ERR_FILE: what a failed pi2 plan said, for the log (its file goes with TMP)
plan_errors() { grep -E "ERROR|WARN" "$1" | tail -n 5 >&2; }

# The npu-worker reads the lent bundles back after a prompt's last step, while decode already runs (it
# reads them as misses until then), so a short generation can end first: wait for the read-back, or for
# the fill to give up (it logs why), for as long as pi2 status shows the npu-worker alive (not dead, not
# stalled: its beats are recent).
npu_log() { echo "$("$PI2" rundir -r "$1")/logs/npu-worker.log"; }
read_backs() { grep -c "lent bundles read back" "$(npu_log "$1")"; } # read_backs RUN
wait_read_back() { # wait_read_back RUN COUNT: until RUN's npu-worker has read the lent bundles back more than COUNT times
    local run=$1 before=$2 n
    while :; do
        n=$(read_backs "$run")
        [ -n "$n" ] || return 1
        [ "$n" -gt "$before" ] && return 0
        grep -q "lent bundles: .*decode reads" "$(npu_log "$run")" && return 1
        "$PI2" status -r "$run" 2>/dev/null | awk '$1 == "npu-worker" && !seen++ { ok = $3 == "ready" || $3 == "busy" } END { exit !ok }' ||
            return 1
        sleep 0.1
    done
}

budgeted() { # budgeted PCT: plan at PCT % of the file, run it in a cap of that size
    local pct=$1 mib=$((SIZE * $1 / 100 / 1048576)) run cg="" rc
    plan_model "$TMP/plan-$pct" "${mib}M" >/dev/null 2>"$TMP/plan-$pct.err"
    rc=$?
    ((rc == 0)) || plan_errors "$TMP/plan-$pct.err"
    check "pi2 plan at $pct % of the file (${mib} MiB)" $rc
    new_run run
    local cmd=("$PI2" up -r "$run" -c "$TMP/off.conf" -m "$MODEL" --plan "$TMP/plan-$pct")
    if ((can_cap)); then
        cg=$CG_ROOT/pi2-$run
        mkdir "$cg" && echo $((mib << 20)) >"$cg/memory.limit_in_bytes"
        sync && echo 3 >/proc/sys/vm/drop_caches
    fi
    in_cg "$cg" "${cmd[@]}" >/dev/null 2>"$TMP/up-$pct.err"
    check "pi2 up --plan at $pct %" $?
    generate "$run" "$TMP/out-$pct.txt" "$cg"
    cmp -s "$TMP/ref.txt" "$TMP/out-$pct.txt"
    check "at $pct % of the file the text equals the unbudgeted run's" $?
    cache_stats "$pct" "$run"
    if [ "$pct" != 100 ]; then
        wait_read_back "$run" 0
        check "at $pct %: after the prompt the npu-worker reads the lent bundles into its prompt memory" $?
    elif [ "$(id -u)" = 0 ]; then
        check_priorities "$run" 1
    else
        skip "real-time priority of the stack's I/O threads (needs root)"
    fi
    "$PI2" status -r "$run" | awk '$1 ~ /^(cachemgr|io-worker|coordinator|npu-worker|cpu-worker)/ && NF == 5 { r += $5 } END { exit r != 0 }'
    check "at $pct %: no process restarted" $?
    if [ -n "$cg" ]; then
        [ "$(awk '/^oom_kill / { print $2 }' "$cg/memory.oom_control")" = 0 ]
        check "at $pct %: nothing killed for memory under the ${mib} MiB cap" $?
    fi
    [ "$pct" = 50 ] || "$PI2" down -r "$run" >/dev/null 2>&1
    [ -n "$cg" ] && [ "$pct" != 50 ] && rmdir "$cg" 2>/dev/null
    LAST_RUN=$run LAST_CG=$cg
}
for pct in 100 60 50; do budgeted "$pct"; done

# the prompt's FFN rows from the pinned bundles: with the neurons ordered hottest-first the pinned ones are
# runs of the file that need not be read
REORDERED=$TMP/m-reordered.pwri
"$BIN/pi2-reorder" -m "$MODEL" -o "$REORDERED" -n 64 --gen 8 >/dev/null 2>&1
check "pi2-reorder orders the test model hottest-first" $?
new_run R
"$PI2" up -r "$R" -c "$TMP/off.conf" -m "$REORDERED" --ffn predictor >/dev/null 2>&1 && generate "$R" "$TMP/ref-r.txt"
check "the unbudgeted stack of the reordered model generates" $?
"$PI2" down -r "$R" >/dev/null 2>&1
"$PI2" plan --hw-point-seconds 0.01 -n 64 --ctx 128 -c "$TMP/off.conf" -m "$REORDERED" \
    --mem-budget "$((SIZE / 1048576))M" -o "$TMP/plan-r" >/dev/null 2>&1 &&
    "$PI2" up -r "$R" -c "$TMP/off.conf" -m "$REORDERED" --plan "$TMP/plan-r" >/dev/null 2>&1 &&
    generate "$R" "$TMP/out-r.txt" && cmp -s "$TMP/ref-r.txt" "$TMP/out-r.txt"
check "reordered model at 100 %: the text equals its unbudgeted stack's" $?
streamed=$(grep -h "FFN rows streamed" "$("$PI2" rundir -r "$R")/logs/npu-worker.log" | tail -n 1)
sed -n 's/.*streamed: \([0-9]*\) MB read and \([0-9]*\) MB copied .*/\1 \2/p' <<<"$streamed" |
    awk '$2 > 0 && $2 >= ($1 + $2) / 10 { ok = 1 } END { exit !ok }'
check "reordered model at 100 %: the prompt copies pinned rows instead of reading them (${streamed#*streamed: })" $?
"$PI2" down -r "$R" >/dev/null 2>&1

# at_60_with VAR=VALUE WHAT TAG: the 60 % plan with VAR=VALUE in the stack's environment, inside its cap:
# the text equals the unbudgeted run's (out-60-TAG.txt); the run is left up as VARIANT_RUN, its cgroup as VARIANT_CG
at_60_with() {
    local cg=""
    new_run VARIANT_RUN
    if ((can_cap)); then
        cg=$CG_ROOT/pi2-$VARIANT_RUN
        mkdir "$cg" && echo $(((SIZE * 60 / 100 / 1048576) << 20)) >"$cg/memory.limit_in_bytes"
        sync && echo 3 >/proc/sys/vm/drop_caches
    fi
    (export "${1?}" && in_cg "$cg" "$PI2" up -r "$VARIANT_RUN" -c "$TMP/off.conf" -m "$MODEL" --plan "$TMP/plan-60") \
        >/dev/null 2>&1
    generate "$VARIANT_RUN" "$TMP/out-60-$3.txt" "$cg"
    cmp -s "$TMP/ref.txt" "$TMP/out-60-$3.txt"
    check "at 60 % $2 ($1) the text equals the unbudgeted run's" $?
    VARIANT_CG=$cg
}
variant_down() {
    "$PI2" down -r "$VARIANT_RUN" >/dev/null 2>&1
    [ -n "$VARIANT_CG" ] && rmdir "$VARIANT_CG" 2>/dev/null
}

# PI2_PREFETCH=0: no reads before attention; the same text (the guess never decides what is computed)
at_60_with PI2_PREFETCH=0 "without asking ahead" noahead
cache_stats 60 "$VARIANT_RUN" noahead
variant_down

# PI2_IO_ENGINE=threads: every reader of the stack (the io-worker's weights and bundles, the npu-worker's
# lent bundles) reads through threads, as where io_uring is refused: misses are read, the same text
at_60_with PI2_IO_ENGINE=threads "with reads by threads" threads
grep -q "reads in flight by threads" "$("$PI2" rundir -r "$VARIANT_RUN")/logs/io-worker.log" &&
    sed -n 's/.*; neuron cache: [0-9.]*% hits, \([0-9.]*\) MB read per token$/\1/p' "$TMP/out-60-threads.txt.err" |
    awk '$1 > 0 { ok = 1 } END { exit !ok }'
check "at 60 % with PI2_IO_ENGINE=threads the io-worker reads the misses by threads" $?
variant_down

# realtime-io=off: every thread at normal priority; the same text
{ cat "$TMP/off.conf"; echo realtime-io=off; } >"$TMP/off-nort.conf"
new_run NORT_RUN
"$PI2" up -r "$NORT_RUN" -c "$TMP/off-nort.conf" -m "$MODEL" --plan "$TMP/plan-60" >/dev/null 2>&1
check "pi2 up --plan at 60 % with realtime-io=off" $?
generate "$NORT_RUN" "$TMP/out-60-nort.txt"
cmp -s "$TMP/ref.txt" "$TMP/out-60-nort.txt"
check "at 60 % with realtime-io=off the text equals the unbudgeted run's" $?
check_priorities "$NORT_RUN" 0
"$PI2" down -r "$NORT_RUN" >/dev/null 2>&1

# guesses RUN: "GUESSED STEPS" from cpu-worker.0's closing log line (the worker stopped with TERM for it)
guesses() {
    local dir log line="" i
    dir=$("$PI2" rundir -r "$1") log=$dir/logs/cpu-worker.0.log
    kill -TERM "$(cat "$dir/cpu-worker.0.pid")" 2>/dev/null
    for ((i = 0; i < 100; i++)); do
        line=$(sed -n 's/.*guessed its misses ahead on \([0-9]*\) of \([0-9]*\) layer steps.*/\1 \2/p' "$log" | tail -n 1)
        [ -n "$line" ] && break
        sleep 0.1
    done
    echo "$line"
}
# a budget that pins every bundle: no layer's misses are guessed ahead (nothing could be read), the same
# text; at 60 % they are
plan_model "$TMP/plan-all" "$((SIZE * 3 / 1048576))M" >/dev/null 2>&1
check "pi2 plan at 300 % of the file" $?
new_run RA
"$PI2" up -r "$RA" -c "$TMP/off.conf" -m "$MODEL" --plan "$TMP/plan-all" >/dev/null 2>&1 &&
    generate "$RA" "$TMP/out-all.txt" && cmp -s "$TMP/ref.txt" "$TMP/out-all.txt"
check "every bundle pinned: the text equals the unbudgeted run's" $?
g=$(guesses "$RA")
awk -v g="$g" 'BEGIN { split(g, f, " "); exit !(g != "" && f[1] == 0 && f[2] > 0) }'
check "every bundle pinned: no layer step guesses its misses ahead (guessed, steps: ${g:-no log line})" $?
"$PI2" down -r "$RA" >/dev/null 2>&1
new_run RA
"$PI2" up -r "$RA" -c "$TMP/off.conf" -m "$MODEL" --plan "$TMP/plan-60" >/dev/null 2>&1 && generate "$RA" "$TMP/out-60-g.txt"
g=$(guesses "$RA")
awk -v g="$g" 'BEGIN { split(g, f, " "); exit !(g != "" && f[1] > 0 && f[1] == f[2]) }'
check "at 60 %: every layer step guesses its misses ahead (guessed, steps: ${g:-no log line})" $?
"$PI2" down -r "$RA" >/dev/null 2>&1

# PI2_LEND=0: the lent bundles stay out, so decode hits less; the same text
at_60_with PI2_LEND=0 "without lending" nolend
hits() { sed -n 's/.*neuron cache: \([0-9.]*\)% hits.*/\1/p' "$1"; }
awk -v with="$(hits "$TMP/out-60.txt.err")" -v without="$(hits "$TMP/out-60-nolend.txt.err")" \
    'BEGIN { exit !(with > without + 0.5) }'
check "... and decode hits less than with the lent bundles ($(hits "$TMP/out-60-nolend.txt.err") % against $(hits "$TMP/out-60.txt.err") %)" $?
variant_down

# faults, on the 50 % stack (the most misses)
R50=$LAST_RUN
# a prompt of several steps: the lent bundles are taken back before each and read back once, after the last
reads0=$(read_backs "$R50") steps0=$(grep -c "prefilled" "$(npu_log "$R50")")
in_cg "$LAST_CG" "$PI2" run -r "$R50" -p "$LONG" -n 8 --seed 1 >"$TMP/long-50.txt" 2>"$TMP/long-50.err"
cmp -s "$TMP/ref-long.txt" "$TMP/long-50.txt"
check "at 50 % a prompt of several steps gives the unbudgeted text" $?
wait_read_back "$R50" "$reads0"
reads=$(($(read_backs "$R50") - reads0)) steps=$(($(grep -c "prefilled" "$(npu_log "$R50")") - steps0))
[ "$reads" = 1 ] && [ "$steps" -ge 2 ]
check "... the lent bundles read back once, after its last step ($reads read backs, $steps steps)" $?
# each process that takes part in a budgeted decode, killed -9 while misses are in flight (decode runs
# from about 0.3 s to 4 s of the generation; most of it waiting for reads)
for victim in io-worker:0.3 cpu-worker.1:1.0 cachemgr:1.5 cpu-worker.0:2.0; do
    name=${victim%:*}
    pid=$(cat "$("$PI2" rundir -r "$R50")/$name.pid")
    ( sleep "${victim#*:}"; kill -9 "$pid" ) &
    generate "$R50" "$TMP/kill.txt" "$LAST_CG"
    wait
    cmp -s "$TMP/ref.txt" "$TMP/kill.txt"
    check "$name killed -9 mid-generation: the same text" $?
    restarted "$("$PI2" rundir -r "$R50")" "$name" "$pid"
    check "the supervisor restarted $name" $?
    for _ in $(seq 100); do # the next kill meets a stack whose every process is ready again
        "$PI2" status -r "$R50" 2>/dev/null | awk '$3 == "starting" { bad = 1 } END { exit bad }' && break
        sleep 0.1
    done
done
if [ -n "$LAST_CG" ]; then # each of those prompts took the lent bundles back first
    [ "$(awk '/^oom_kill / { print $2 }' "$LAST_CG/memory.oom_control")" = 0 ]
    check "at 50 %: five generations, the lent bundles taken back before each prompt: nothing killed for memory" $?
fi
# hostile batches in a cpu-worker's bundle ring (pi2-garbage --ring, the stack idle): each refused in its
# answer, the damaged ring emptied; the io-worker keeps serving and the next generation is right
io_pid=$(cat "$("$PI2" rundir -r "$R50")/io-worker.pid")
"$BIN/pi2-garbage" --ring "$R50:1" >"$TMP/ring.out" 2>&1 && [ "$(grep -c ": refused: " "$TMP/ring.out")" = 3 ]
check "hostile batches in a cpu-worker's bundle ring: the io-worker refuses each" $?
# a packed hot region's staging read once the weights are loaded (a stale cachemgr's): refused, as the cold
# region holds slots by then
"$BIN/pi2-garbage" -e "ipc://$("$PI2" rundir -r "$R50")/io.sock" --stale-staging >"$TMP/staging.out" 2>&1 &&
    grep -q "refused" "$TMP/staging.out"
check "a staging read after the load: the io-worker refuses it" $?
generate "$R50" "$TMP/after-ring.txt" "$LAST_CG"
cmp -s "$TMP/ref.txt" "$TMP/after-ring.txt" && [ "$(cat "$("$PI2" rundir -r "$R50")/io-worker.pid")" = "$io_pid" ]
check "... and keeps serving: the next generation gives the same text" $?
"$PI2" down -r "$R50" >/dev/null 2>&1
[ -n "$LAST_CG" ] && rmdir "$LAST_CG" 2>/dev/null

# a cpu-worker killed while it holds pins (PI2_CHUNK_DELAY keeps worker 1 computing from pinned rows most
# of the time): the process that takes its place lets them go, so once the stack is idle no slot is pinned
new_run RP
PI2_CHUNK_DELAY=1:20000 "$PI2" up -r "$RP" -c "$TMP/off.conf" -m "$MODEL" --plan "$TMP/plan-50" >/dev/null 2>&1
pid=$(cat "$("$PI2" rundir -r "$RP")/cpu-worker.1.pid")
( sleep 1.0; kill -9 "$pid" ) &
"$PI2" run -r "$RP" -p "$PROMPT" -n 6 --seed 1 >"$TMP/pins.txt" 2>/dev/null
wait
head -c -1 "$TMP/pins.txt" >"$TMP/pins.trim" # the newline that ends a generation
[ -s "$TMP/pins.trim" ] && cmp -s "$TMP/pins.trim" <(head -c "$(stat -c %s "$TMP/pins.trim")" "$TMP/ref.txt")
check "a cpu-worker killed -9 while it holds pins: the same text" $?
restarted "$("$PI2" rundir -r "$RP")" cpu-worker.1 "$pid"
"$PI2" status -r "$RP" | grep -q "^cold slots: [0-9]*, 0 pinned now, 0 loading"
check "... and once the stack is idle no cold slot is pinned or loading" $?
"$PI2" down -r "$RP" >/dev/null 2>&1

new_run RF
PI2_BUNDLE_FAULT=eio:2 "$PI2" up -r "$RF" -c "$TMP/off.conf" -m "$MODEL" --plan "$TMP/plan-50" >/dev/null 2>&1
generate "$RF" "$TMP/eio2.txt"
cmp -s "$TMP/ref.txt" "$TMP/eio2.txt"
check "two bundle reads failing with EIO are read again: the same text" $?
"$PI2" down -r "$RF" >/dev/null 2>&1
new_run RF
PI2_BUNDLE_FAULT=corrupt:100000 "$PI2" up -r "$RF" -c "$TMP/off.conf" -m "$MODEL" --plan "$TMP/plan-50" >/dev/null 2>&1
generate "$RF" "$TMP/bad.txt"
st=$?
[ $st -ne 0 ] && grep -q "bundles.gguf.*\(checksum\|match\)" "$TMP/bad.txt.err"
check "bundles that keep reading corrupt end the generation with an error naming the bundle file" $?
# what was printed before the error (the prompt, the prefill's token) is the start of the right text
head -c -1 "$TMP/bad.txt" >"$TMP/bad.trim"
cmp -s "$TMP/bad.trim" <(head -c "$(stat -c %s "$TMP/bad.trim")" "$TMP/ref.txt")
check "... and never with other text" $?
"$PI2" down -r "$RF" >/dev/null 2>&1
# checks off (stack config bundle-checksums=off): the same corruption is not caught, so the switch is real
{ cat "$TMP/off.conf"; echo bundle-checksums=off; } >"$TMP/nocheck.conf"
new_run RF
PI2_BUNDLE_FAULT=corrupt:100000 "$PI2" up -r "$RF" -c "$TMP/nocheck.conf" -m "$MODEL" --plan "$TMP/plan-50" >/dev/null 2>&1
generate "$RF" "$TMP/nocheck.txt" &&
    grep -q "checksums not checked" "$("$PI2" rundir -r "$RF")/logs/io-worker.log"
check "bundle-checksums=off: the io-worker does not check, a corrupted read goes through" $?
"$PI2" down -r "$RF" >/dev/null 2>&1

# under the floor
new_run RL
"$PI2" up -r "$RL" -c "$TMP/off.conf" -m "$MODEL" --mem-budget 64M >/dev/null 2>"$TMP/low.err"
st=$?
[ $st -ne 0 ] && grep -q "needs at least .*MiB" "$TMP/low.err"
check "pi2 up --mem-budget under the floor is refused with the floor named" $?
no_leftovers "$RL"
check "... and starts nothing" $?

# a budget without an npu-worker: the prompt would need every FFN row on the cpu-workers
new_run RN2
"$PI2" up -r "$RN2" -c "$TMP/off.conf" -m "$MODEL" --plan "$TMP/plan-50" --no-npu >/dev/null 2>"$TMP/nonpu.err"
st=$?
[ $st -ne 0 ] && grep -q "prompt runs on the npu-worker" "$TMP/nonpu.err"
check "pi2 up --plan --no-npu is refused, saying the prompt needs the npu-worker" $?
no_leftovers "$RN2"
check "... and starts nothing" $?

# the plan's prompt step: a config without max-prefill takes the plan's (its memory counts that many
# tokens' buffers); one asking for more than the plan's is refused, naming both
grep -v '^max-prefill=' "$TMP/off.conf" >"$TMP/nomax.conf"
new_run RM
"$PI2" up -r "$RM" -c "$TMP/nomax.conf" -m "$MODEL" --plan "$TMP/plan-50" >/dev/null 2>&1 &&
    "$BIN/pi2-ctl" -r "$RM" status 2>/dev/null | grep -q "max prefill 32$"
check "a stack config without max-prefill takes the plan's (32 tokens a step)" $?
"$PI2" down -r "$RM" >/dev/null 2>&1
{ cat "$TMP/nomax.conf"; echo max-prefill=64; } >"$TMP/bigmax.conf"
new_run RM2
"$PI2" up -r "$RM2" -c "$TMP/bigmax.conf" -m "$MODEL" --plan "$TMP/plan-50" >/dev/null 2>"$TMP/bigmax.err"
st=$?
[ $st -ne 0 ] && grep -q "max-prefill 64: the plan .* 32 tokens a step" "$TMP/bigmax.err"
check "max-prefill above the plan's is refused, naming both" $?
no_leftovers "$RM2"
check "... and starts nothing" $?

# a GGUF file (ffn_down: the prompt streams whole layers) in gate-first mode at 80 % (every gate row
# preloaded puts its floor near 70 %): the unbudgeted gate-first stack's text, nothing killed
GG=$TMP/m.gguf
"$BIN/mkmodel" -o "$GG" --preset small --dim 1024 --ff 16384 --layers 16 --heads 16 --kv-heads 4 --vocab 512 \
    --ctx 128 --act relu --seed 5 >/dev/null 2>&1
new_run RG
"$PI2" up -r "$RG" -c "$TMP/off.conf" -m "$GG" --ffn gate-first >/dev/null 2>&1 && generate "$RG" "$TMP/ref-gg.txt"
check "the unbudgeted GGUF stack generates (gate-first)" $?
"$PI2" down -r "$RG" >/dev/null 2>&1
gmib=$(($(stat -c %s "$GG") * 80 / 100 / 1048576))
"$PI2" plan --hw-point-seconds 0.01 -n 64 --ctx 128 -c "$TMP/off.conf" -m "$GG" --mem-budget "${gmib}M" \
    -o "$TMP/plan-gg" >/dev/null 2>"$TMP/plan-gg.err"
rc=$?
((rc == 0)) || plan_errors "$TMP/plan-gg.err"
check "pi2 plan of the GGUF file at 80 % (${gmib} MiB, gate-first)" $rc
new_run RG2
cg=""
if ((can_cap)); then
    cg=$CG_ROOT/pi2-$RG2
    mkdir "$cg" && echo $((gmib << 20)) >"$cg/memory.limit_in_bytes"
    sync && echo 3 >/proc/sys/vm/drop_caches
fi
in_cg "$cg" "$PI2" up -r "$RG2" -c "$TMP/off.conf" -m "$GG" --plan "$TMP/plan-gg" >/dev/null 2>&1 &&
    generate "$RG2" "$TMP/out-gg.txt" "$cg" && cmp -s "$TMP/ref-gg.txt" "$TMP/out-gg.txt"
check "the GGUF file at 80 % (gate-first, whole layers streamed) gives the unbudgeted text" $?
grep -q "staging, 16384 neurons at a time" "$("$PI2" rundir -r "$RG2")/logs/npu-worker.log"
check "... its npu-worker streams whole layers (16384 neurons at a time)" $?
if [ -n "$cg" ]; then
    [ "$(awk '/^oom_kill / { print $2 }' "$cg/memory.oom_control")" = 0 ]
    check "... nothing killed for memory under the ${gmib} MiB cap" $?
fi
"$PI2" down -r "$RG2" >/dev/null 2>&1
[ -n "$cg" ] && rmdir "$cg" 2>/dev/null

# the caps' cgroups (their processes are gone with the runs)
for cg in "$CG_ROOT"/pi2-"$RUN_BASE"-*; do if [ -d "$cg" ]; then rmdir "$cg"; fi; done
