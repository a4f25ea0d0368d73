#!/usr/bin/env bash
# The whole stack, real processes: `pi2 up` / `pi2 run` / `pi2 down` on every
# oracle model gives exactly pi2-ref's greedy text (2 cpu-workers, 1 cpu-worker,
# no npu-worker); kill -9 of each worker kind mid-generation changes nothing;
# a killed coordinator ends the client with an error and the supervisor
# removes the stack by itself; garbage frames on every socket are survived;
# config errors are refused naming the line; nothing is left behind.
set -u
cd "$(dirname "$0")/.." || exit 1
SHARED=${PI2_SHARED:-../shared}
ORACLE=$SHARED/oracle
RUN_BASE="ts$$"
# shellcheck source=tests/sh/stack_common.sh
. tests/sh/stack_common.sh
GARBAGE=$BIN/pi2-garbage

require_programs pi2 pi2-ref pi2-garbage cachemgr io-worker coordinator npu-worker cpu-worker pi2-ctl pi2-client
if [ ! -d "$ORACLE" ]; then
    check "oracle folder $ORACLE exists (PI2_SHARED)" 1
    exit 1
fi

gen() { # gen RUN PROMPT N [flags]: the stack's text on stdout, client errors in $TMP/gen.err
    local run=$1 prompt=$2 n=$3
    shift 3
    timeout 120 "$PI2" run -r "$run" -p "$prompt" -n "$n" "$@" 2>"$TMP/gen.err"
}

ref() { # ref MODEL PROMPT N [flags]
    local model=$1 prompt=$2 n=$3
    shift 3
    "$REF" -m "$model" -p "$prompt" -n "$n" -c 512 -t 2 "$@" 2>/dev/null
}

# same NAME EXPECTED GOT [RUN]: identical non-empty text (an empty pair means both failed), with the logs when not
same() {
    if [ -n "$2" ] && [ "$2" == "$3" ]; then
        check "$1" 0
    else
        check "$1" 1
        printf 'expected: %q\ngot:      %q\n' "$2" "$3"
        sed 's/^/client: /' "$TMP/gen.err" | tail -n 5
        [ -n "${4:-}" ] && dump_logs "$4"
    fi
}

# ---- command line and config validation (nothing is started) ----
"$PI2" -h | grep -q 'up -m MODEL'; check "pi2 -h prints the commands" $?
MODEL0=$ORACLE/stories260K.gguf
bad_config() { # bad_config NAME EXPECTED-MESSAGE-REGEX LINES...
    local name=$1 want=$2 run
    shift 2
    printf '%s\n' "$@" >"$TMP/bad.conf"
    new_run run
    "$PI2" up -m "$MODEL0" -c "$TMP/bad.conf" -r "$run" >"$TMP/bad.out" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && grep -Eq "$want" "$TMP/bad.out" && no_leftovers "$run"
    local ok=$?
    check "config error refused, named, nothing started: $name" $ok
    [ $ok -eq 0 ] || cat "$TMP/bad.out"
}
bad_config "unknown process" 'bad.conf:3: unknown process .gpu-worker.' \
    "cachemgr" "# comment" "gpu-worker cpus=0" "io-worker" "coordinator" "cpu-worker"
bad_config "bad cpu list" 'bad.conf:2: cpus=.0-x.' "cachemgr" "io-worker cpus=0-x" "coordinator" "cpu-worker"
bad_config "backwards cpu range" 'bad.conf:4: .*backwards' "cachemgr" "io-worker" "coordinator" "cpu-worker cpus=1-0"
bad_config "unavailable cpu" 'bad.conf:4: .*CPU 4096 is not available' "cachemgr" "io-worker" "coordinator" "cpu-worker cpus=4096"
bad_config "threads on the coordinator" 'bad.conf:3: coordinator takes no threads' \
    "cachemgr" "io-worker" "coordinator threads=2" "cpu-worker"
bad_config "zero threads" 'bad.conf:4: threads=.0.' "cachemgr" "io-worker" "coordinator" "cpu-worker threads=0"
bad_config "unknown setting" 'bad.conf:1: unknown setting .cpu=0.' "cachemgr cpu=0" "io-worker" "coordinator" "cpu-worker"
bad_config "bad checksum switch" 'bad.conf:1: bundle-checksums=.maybe. is not on or off' \
    "bundle-checksums=maybe" "cachemgr" "io-worker" "coordinator" "cpu-worker"
bad_config "two coordinators" 'bad.conf:4: a second coordinator' "cachemgr" "io-worker" "coordinator" "coordinator" "cpu-worker"
bad_config "no cpu-worker" 'no cpu-worker line' "cachemgr" "io-worker" "coordinator"
bad_config "no cachemgr" 'no cachemgr line' "io-worker" "coordinator" "cpu-worker"
new_run R
"$PI2" down -r "$R" >/dev/null 2>&1 && "$PI2" down -r "$R" >/dev/null 2>&1
check "pi2 down of a run that is not up succeeds, twice" $?
"$PI2" up -m "$TMP/missing.gguf" -c "$TMP/two.conf" -r "$R" >/dev/null 2>&1
[ $? -ne 0 ]; check "pi2 up with a missing model fails" $?

# ---- every oracle model: 2 cpu-workers, 1 cpu-worker, no npu-worker ----
# (without an npu-worker the prompt runs token by token: pi2-ref --token-prompt)
PROMPT="Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
for name in stories260K synth-f32 synth-f16 synth-q8_0 synth-q4_0; do
    model=$ORACLE/$name.gguf
    want_pass=$(ref "$model" "$PROMPT" 32 --temp 0)
    want_tokens=$(ref "$model" "$PROMPT" 32 --temp 0 --token-prompt)
    [ -n "$want_pass" ] && [ -n "$want_tokens" ]; check "$name: pi2-ref gives text" $?
    for variant in two one no-npu; do
        want=$want_pass
        [ $variant = no-npu ] && want=$want_tokens
        new_run R
        case $variant in
        two) up "$R" "$TMP/two.conf" "$model" ;;
        one) up "$R" "$TMP/one.conf" "$model" ;;
        no-npu) up "$R" "$TMP/two.conf" "$model" --no-npu ;;
        esac
        check "$name/$variant: pi2 up" $?
        got=$(gen "$R" "$PROMPT" 32 --temp 0)
        same "$name/$variant: pi2 run == pi2-ref (greedy, 32 tokens)" "$want" "$got" "$R"
        if [ $variant = two ]; then
            got=$(gen "$R" "$PROMPT" 32 --temp 0)
            same "$name/$variant: a second generation on the same stack is the same" "$want" "$got" "$R"
        fi
        down_out=$("$PI2" down -r "$R" 2>&1) && no_leftovers "$R"
        check "$name/$variant: pi2 down leaves nothing" $?
        ! grep -q "left behind" <<<"$down_out"
        check "$name/$variant: pi2 down: the supervisor stopped the stack itself" $?
    done
done

# ---- one long-lived stack on stories260K: sampling, status, restart, logs, profile, garbage ----
new_run R
up "$R" "$TMP/two.conf" "$MODEL0" --small-pages
check "stories260K: pi2 up --small-pages (2 cpu-workers)" $?
RD=$("$PI2" rundir -r "$R")
tr '\0' ' ' <"/proc/$(cat "$RD/cachemgr.pid")/cmdline" | grep -q -- " --small-pages"
check "pi2 up --small-pages reaches cachemgr" $?
"$PI2" up -m "$MODEL0" -c "$TMP/two.conf" -r "$R" >/dev/null 2>&1
[ $? -ne 0 ]; check "a second pi2 up of a live run is refused" $?

want=$(ref "$MODEL0" "Once upon a time" 40 --temp 0.8 --top-k 40 --top-p 0.95 --seed 42)
got=$(gen "$R" "Once upon a time" 40 --temp 0.8 --top-k 40 --top-p 0.95 --seed 42)
same "sampled generation (temp 0.8, seed 42) == pi2-ref" "$want" "$got" "$R"

long_prompt=$(printf 'Once upon a time there was a little dog. %.0s' $(seq 120)) # ~1200 tokens, context 512
gen "$R" "$long_prompt" 8 --temp 0 >/dev/null
rc=$?
[ $rc -ne 0 ] && grep -q "context of 512 tokens (pi2 up --ctx N)" "$TMP/gen.err"
ok=$?
check "a prompt over the context: the client exits non-zero naming the context and --ctx (rc $rc)" $ok
[ $ok -eq 0 ] || cat "$TMP/gen.err"
got=$(gen "$R" "Once upon a time" 40 --temp 0.8 --top-k 40 --top-p 0.95 --seed 42)
same "... and the stack serves the next request as before" "$want" "$got" "$R"

"$PI2" status -r "$R" >"$TMP/status" 2>&1
ok=0
for proc in cachemgr io-worker coordinator npu-worker cpu-worker.0 cpu-worker.1; do
    pid=$(cat "$RD/$proc.pid" 2>/dev/null)
    # pi2-ctl's table: name pid state beat_ms tokens restarts rss_MiB cpus (applied);
    # the supervisor's: name pid cpus (configured) threads restarts
    grep -Eq "^$proc +$pid +(ready|busy) +[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9][0-9,-]*\$" "$TMP/status" ||
        { ok=1; echo "pi2-ctl status lacks $proc pid $pid with heartbeat, RSS, CPUs"; }
    grep -Eq "^$proc +$pid +[0-9][0-9,-]* +[0-9]+ +[0-9]+\$" "$TMP/status" ||
        { ok=1; echo "supervisor table lacks $proc pid $pid"; }
done
check "pi2 status: every process with its pid, heartbeat age and CPU list" $ok
[ $ok -eq 0 ] || cat "$TMP/status"

"$PI2" logs coordinator -r "$R" | grep -q .; check "pi2 logs coordinator prints the log" $?
"$PI2" profile cpu-worker.0 1 -r "$R" >"$TMP/profile" 2>&1 && grep -Eq '[0-9.]+%' "$TMP/profile"
check "pi2 profile cpu-worker.0 1 prints a symbol summary" $?

old=$(cat "$RD/cpu-worker.1.pid")
"$PI2" restart cpu-worker.1 -r "$R" >/dev/null 2>&1 && new=$(cat "$RD/cpu-worker.1.pid") && [ "$new" != "$old" ] &&
    kill -0 "$new"
check "pi2 restart cpu-worker.1 starts a new process" $?
want=$(ref "$MODEL0" "$PROMPT" 32 --temp 0)
got=$(gen "$R" "$PROMPT" 32 --temp 0)
same "after pi2 restart, the generation is unchanged" "$want" "$got" "$R"

pids_before=$(cat "$RD"/*.pid | sort | tr '\n' ' ')
ok=0 n_sock=0
for sock in "$RD"/*.sock; do
    [ -S "$sock" ] || continue
    n_sock=$((n_sock + 1))
    "$GARBAGE" -e "ipc://$sock" -n 10 >/dev/null || { ok=1; echo "pi2-garbage failed on $sock"; }
done
[ $ok -eq 0 ] && [ $n_sock -ge 3 ]
check "garbage frames sent to every socket of the run ($n_sock)" $?
got=$(gen "$R" "$PROMPT" 32 --temp 0)
same "after garbage on every socket, the generation is unchanged" "$want" "$got" "$R"
[ "$(cat "$RD"/*.pid | sort | tr '\n' ' ')" = "$pids_before" ]
check "no process died of the garbage" $?
kill -9 "$(cat "$RD/supervisor.pid")"
sleep 0.2
"$PI2" down -r "$R" >/dev/null 2>&1 && no_leftovers "$R"
check "supervisor killed -9: pi2 down still stops every process and leaves nothing" $?

# ---- kill -9 of each worker kind mid-generation ----
# Every task of the cpu-/npu-workers sleeps PI2_TASK_DELAY_US, so a generation
# lasts seconds and the kill lands in the middle of it.
export PI2_TASK_DELAY_US=${PI2_TEST_TASK_DELAY_US:-20000}
FAULT_N=24
LONG_PROMPT="$PROMPT Every day she ran to the swings, and her friend Tom came with his red ball. They played until the sun went down, and then they walked home together."
want=$(ref "$MODEL0" "$LONG_PROMPT" $FAULT_N --temp 0)
new_run R
up "$R" "$TMP/two.conf" "$MODEL0"
check "fault stack: pi2 up with PI2_TASK_DELAY_US=$PI2_TASK_DELAY_US" $?
RD=$("$PI2" rundir -r "$R")
t0=$(date +%s.%N)
got=$(gen "$R" "$LONG_PROMPT" $FAULT_N --temp 0)
undisturbed_s=$(echo "$(date +%s.%N) - $t0" | bc)
same "fault stack: undisturbed generation == pi2-ref" "$want" "$got" "$R"
awk -v t="$undisturbed_s" -v n=$FAULT_N -v d="$PI2_TASK_DELAY_US" 'BEGIN { exit !(t >= n * d / 1e6) }'
check "pi2 up passed PI2_TASK_DELAY_US to the workers ($FAULT_N tokens took $undisturbed_s s)" $?

# kill_mid PROC DELAY_S [stopped]: kill -9 PROC DELAY_S into a generation; the
# output is unchanged and PROC comes back. "stopped": SIGSTOP it before the
# generation starts, so its request is certainly in flight when it dies (the
# npu-worker's prefill of a short prompt lasts only milliseconds).
kill_mid() {
    local proc=$1 delay=$2 victim rc
    victim=$(cat "$RD/$proc.pid")
    [ "${3:-}" = stopped ] && kill -STOP "$victim"
    gen "$R" "$LONG_PROMPT" $FAULT_N --temp 0 >"$TMP/out" &
    local client=$!
    sleep "$delay"
    kill -0 "$client" 2>/dev/null
    check "$proc: the generation is still running when it is killed" $?
    kill -9 "$victim"
    wait "$client"
    rc=$?
    check "$proc killed: the client succeeds" $rc
    same "$proc killed mid-generation: output unchanged" "$want" "$(cat "$TMP/out")" "$R"
    restarted "$RD" "$proc" "$victim"
    check "$proc killed: the supervisor restarted it" $?
}
kill_mid cpu-worker.1 1.0
kill_mid npu-worker 0.5 stopped
kill_mid io-worker 1.0
kill_mid cachemgr 1.0
kill_mid cpu-worker.0 1.0
got=$(gen "$R" "$LONG_PROMPT" $FAULT_N --temp 0)
same "after the kills, a new generation == pi2-ref" "$want" "$got" "$R"

# ---- kill -9 of the coordinator: client error, the supervisor removes the stack ----
gen "$R" "$LONG_PROMPT" $FAULT_N --temp 0 >/dev/null &
client=$!
sleep 1.0
kill -9 "$(cat "$RD/coordinator.pid")"
wait "$client"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -s "$TMP/gen.err" ]
check "coordinator killed: the client exits non-zero with an error (rc $rc)" $?
sed 's/^/client: /' "$TMP/gen.err" | tail -n 2
# The supervisor gives each process 5 s between SIGTERM and SIGKILL; an
# ASan build on a loaded machine needs margin beyond that (CI once missed 10 s).
ok=1 t0=$SECONDS
while ((SECONDS - t0 < 20)); do
    if [ -z "$(run_procs "$R")" ] && ! compgen -G "/dev/shm/pi2-$R-*" >/dev/null; then ok=0; break; fi
    sleep 0.1
done
check "coordinator killed: within 20 s no process and no segment of the run remain" $ok
if [ $ok -ne 0 ]; then
    echo "still there after $((SECONDS - t0)) s:"
    for p in $(run_procs "$R"); do ps -o pid=,stat=,etime=,args= -p "$p"; done
    echo /dev/shm/pi2-"$R"-*
    dump_logs "$R"
fi
"$PI2" status -r "$R" 2>&1 | grep -q "coordinator"
check "coordinator killed: pi2 status tells why the stack stopped" $?
"$PI2" down -r "$R" >/dev/null 2>&1 && no_leftovers "$R"
check "coordinator killed: pi2 down then leaves nothing" $?
unset PI2_TASK_DELAY_US

# ---- logs are capped: past PI2_LOG_CAP_KB a log moves to .log.1 and starts again ----
new_run R
PI2_LOG_CAP_KB=1 up "$R" "$TMP/two.conf" "$MODEL0"
check "log cap stack: pi2 up with PI2_LOG_CAP_KB=1" $?
RD=$("$PI2" rundir -r "$R")
gen "$R" "Once upon a time" 8 --temp 0 >/dev/null
printf '%04096d\n' 0 >>"$RD/logs/cpu-worker.1.log" # a chatty process: 4 KiB more than the cap
ok=1 t0=$SECONDS
while ((SECONDS - t0 < 12)); do # the supervisor looks every 5 s at most
    if compgen -G "$RD/logs/*.log.1" >/dev/null && grep -q "KiB: moved to" "$RD/logs/supervisor.log"; then ok=0; break; fi
    sleep 0.2
done
check "a log past its cap is moved to NAME.log.1, and the supervisor says so" $ok
ok=0
for f in "$RD"/logs/*.log.1; do
    [ -e "$f" ] || continue
    [ "$(stat -c %s "${f%.1}")" -lt "$(stat -c %s "$f")" ] || { ok=1; echo "$(basename "$f") is not the larger one"; }
done
check "... and the log itself starts again" $ok
"$PI2" down -r "$R" >/dev/null 2>&1

finish
[ $fail -eq 0 ]
