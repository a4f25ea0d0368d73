#!/usr/bin/env bash
# A flood soak (issue 19): while a generation runs on the stories260K stack,
# pi2-garbage sends tens of thousands of hostile messages to every socket of
# the run (client-0.sock, coordinator-0.sock, io.sock) from peers that never
# read an answer. The generation's tokens equal a quiet run's, every heartbeat stays
# younger than 1 s (pi2-ctl status sampled a few times a second), nothing is
# restarted, every process's log stays short, and a client right after the
# flood is served the same tokens about as fast as on a quiet stack. Then a
# second client waits its turn, and a stuck coordinator and io-worker are
# shown stalled and restarted by the supervisor.
set -u
cd "$(dirname "$0")/.." || exit 1
SHARED=${PI2_SHARED:-../shared}
MODEL=$SHARED/oracle/stories260K.gguf
RUN_BASE="tf$$"
# shellcheck source=tests/sh/stack_common.sh
. tests/sh/stack_common.sh
GARBAGE=$BIN/pi2-garbage
CTL=$BIN/pi2-ctl
ROUNDS=${PI2_FLOOD_ROUNDS:-500}   # ~23 messages a round, a peer that never reads its answers
SEEDS=${PI2_FLOOD_SEEDS:-3}       # such peers per socket, one after the other: ~34,500 messages each
BEAT_LIMIT_MS=1000
LOG_LINES_MAX=200                 # log lines the flood may add to any process's log (one a second per peer)
PROMPT="Once upon a time, there was a little girl named Lily."
N=64

require_programs pi2 pi2-garbage pi2-ctl pi2-client cachemgr io-worker coordinator npu-worker cpu-worker
if [ ! -f "$MODEL" ]; then
    check "oracle model $MODEL exists (PI2_SHARED)" 1
    exit 1
fi

gen() { # gen RUN N: the stack's greedy text on stdout, client errors in $TMP/gen.err
    timeout 60 "$PI2" run -r "$1" -p "$PROMPT" -n "$2" --temp 0 2>"$TMP/gen.err"
}

# max_beat RUN: the oldest heartbeat (ms) among the live processes in pi2-ctl status
max_beat() {
    "$CTL" -r "$1" status 2>/dev/null | awk '
        /^process / { table = 1; next }
        table && NF >= 8 && $3 != "dead" && $3 != "exited" { if ($4 > m) m = $4 }
        /^segments:/ { table = 0 }
        END { print m + 0 }'
}

# Every task of the workers sleeps 20 ms: a generation takes ~7 s, long enough
# that the flood meets every stage of one.
export PI2_TASK_DELAY_US=${PI2_TEST_TASK_DELAY_US:-20000}
new_run R
up "$R" "$TMP/two.conf" "$MODEL" --small-pages
check "flood stack: pi2 up (stories260K, PI2_TASK_DELAY_US=$PI2_TASK_DELAY_US)" $?
RD=$("$PI2" rundir -r "$R")
want=$(gen "$R" $N)
[ -n "$want" ]; check "quiet run gives text" $?
t0=$(date +%s.%N)
want_short=$(gen "$R" 8)
quiet_s=$(echo "$(date +%s.%N) - $t0" | bc)

pids_before=$(cat "$RD"/*.pid | sort | tr '\n' ' ')
declare -A log_before=()
for f in "$RD"/logs/*.log; do log_before[$f]=$(wc -l <"$f"); done
# Generations follow one another for as long as the flood lasts, however long
# it takes on this machine (ASan, an emulator, a loaded host): the last one
# ends after the flood, so every flooded moment has a generation running.
gen_through_flood() {
    local i=0
    while :; do
        i=$((i + 1))
        gen "$R" $N >"$TMP/flood.out.$i" || echo "generation $i: exit $?" >>"$TMP/flood.failed"
        [ -e "$TMP/flood.over" ] && break
    done
    echo $i >"$TMP/flood.count"
}
rm -f "$TMP"/flood.*
gen_through_flood &
client=$!
sleep 0.3
# flood SOCK LOG: SEEDS peers one after the other, each ROUNDS rounds; fails if any did
flood() {
    local seed rc=0
    for seed in $(seq "$SEEDS"); do "$GARBAGE" -e "ipc://$1" -n "$ROUNDS" -s "$seed" >>"$2" 2>&1 || rc=1; done
    return $rc
}
socks=("$RD/client-0.sock" "$RD/coordinator-0.sock" "$RD/io.sock")
flooders=()
for i in "${!socks[@]}"; do
    flood "${socks[$i]}" "$TMP/garbage.$i" &
    flooders+=($!)
done
# Sample every heartbeat a few times a second while any flooder sends, and
# for a second after: the receivers may still be working through their queues.
worst=0 samples=0 t_flood=$SECONDS
sample() {
    local b
    b=$(max_beat "$R")
    ((b > worst)) && worst=$b
    samples=$((samples + 1))
    sleep 0.1
}
while kill -0 "${flooders[@]}" 2>/dev/null; do sample; done
flood_s=$((SECONDS - t_flood))
touch "$TMP/flood.over"
for _ in 1 2 3 4 5; do sample; done
ok=0
for i in "${!flooders[@]}"; do wait "${flooders[$i]}" || { ok=1; cat "$TMP/garbage.$i"; }; done
check "$SEEDS pi2-garbage peers sent all of their $ROUNDS rounds to each of ${#socks[@]} sockets" $ok
echo "flood: about $flood_s s; oldest heartbeat ${worst} ms over $samples samples"
((worst < BEAT_LIMIT_MS)); check "no heartbeat older than $BEAT_LIMIT_MS ms during the flood (oldest $worst ms)" $?
wait "$client"
n_gens=$(cat "$TMP/flood.count" 2>/dev/null || echo 0)
echo "generations that spanned the flood: $n_gens"
[ ! -e "$TMP/flood.failed" ] && ((n_gens >= 1))
check "every client of the $n_gens generations that spanned the flood succeeds" $?
[ -e "$TMP/flood.failed" ] && cat "$TMP/flood.failed"
ok=0
((n_gens >= 1)) || ok=1
for i in $(seq "$n_gens"); do
    got=$(cat "$TMP/flood.out.$i")
    [ -n "$got" ] && [ "$got" == "$want" ] && continue
    ok=1
    printf 'generation %d expected: %q\ngot:      %q\n' "$i" "$want" "$got"
done
check "the flooded generations' tokens equal the quiet run's" $ok
[ $ok -eq 0 ] || dump_logs "$R"

t0=$(date +%s.%N)
got=$(gen "$R" 8)
after_s=$(echo "$(date +%s.%N) - $t0" | bc)
[ -n "$got" ] && [ "$got" == "$want_short" ]; check "a client right after the flood gets the same tokens" $?
sed 's/^/client: /' "$TMP/gen.err" | tail -n 3
echo "right after the flood: ${after_s} s (quiet: ${quiet_s} s)"
[ "$got" == "$want_short" ] && awk -v a="$after_s" -v q="$quiet_s" 'BEGIN { exit !(a < q + 1) }'
check "... within a second of a quiet run's time (${after_s} s vs ${quiet_s} s)" $?

[ "$(cat "$RD"/*.pid | sort | tr '\n' ' ')" = "$pids_before" ]
check "nothing was restarted" $?
ok=0
for f in "${!log_before[@]}"; do
    grown=$(($(wc -l <"$f") - log_before[$f]))
    echo "$(basename "$f") grew by $grown lines"
    ((grown < LOG_LINES_MAX)) || ok=1
done
check "no process's log grew by $LOG_LINES_MAX lines or more" $ok

# ---- a second client waits its turn (queue): told how many are ahead, served when the slot frees ----
gen "$R" $N >"$TMP/first.out" &
first=$!
sleep 0.5
timeout 60 "$PI2" run -r "$R" -p "$PROMPT" -n 8 --temp 0 >"$TMP/second.out" 2>"$TMP/second.err" &
second=$!
sleep 0.3
t0=$(date +%s.%N)
timeout 30 "$PI2" run -r "$R" -p "$PROMPT" -n 8 --temp 0 --wait 1 >/dev/null 2>"$TMP/third.err"
st=$?
third_s=$(echo "$(date +%s.%N) - $t0" | bc)
[ $st -ne 0 ] && grep -q "waited 1\.[0-9] s for the generations before it (2 ahead).*STACK_BUSY" "$TMP/third.err" &&
    awk -v t="$third_s" 'BEGIN { exit !(t < 3) }'
check "a client with --wait 1 behind two generations is refused after its wait (${third_s} s)" $?
[ $st -eq 0 ] && cat "$TMP/third.err"
timeout 30 "$PI2" run -r "$R" -p "$PROMPT" -n 8 --temp 0 --wait 0 >/dev/null 2>"$TMP/fourth.err"
[ $? -ne 0 ] && grep -q "may not wait.*STACK_BUSY" "$TMP/fourth.err"
check "a client with --wait 0 is refused at once" $?
wait "$first" && [ "$(cat "$TMP/first.out")" == "$want" ]
check "the first generation is served undisturbed" $?
wait "$second" && [ "$(cat "$TMP/second.out")" == "$want_short" ]
check "the queued client gets the same tokens as a quiet run, once the first is done" $?
grep -q "waiting for the stack: 1 generation ahead" "$TMP/second.err"
check "... and was told it waits, with one generation ahead" $?
unset PI2_TASK_DELAY_US
"$PI2" down -r "$R" >/dev/null 2>&1

# ---- a stuck coordinator and io-worker (SIGSTOP: alive, silent) are shown stalled, then restarted ----
new_run S
PI2_STALL_S=2 up "$S" "$TMP/two.conf" "$MODEL" --small-pages
check "stall stack: pi2 up with PI2_STALL_S=2" $?
SD=$("$PI2" rundir -r "$S")
before=$(gen "$S" 16)
stuck=("$(cat "$SD/coordinator.pid")" "$(cat "$SD/io-worker.pid")")
kill -STOP "${stuck[@]}"
sleep 1.5
"$CTL" -r "$S" status 2>/dev/null | grep -Eq "^coordinator +${stuck[0]} +stalled "
check "pi2 status shows the stopped coordinator as stalled" $?
ok=1 t0=$SECONDS
while ((SECONDS - t0 < 20)); do # the limit, then the supervisor's next look (5 s at most)
    [ "$(grep -c "has not beaten for .* killing it to start it again" "$SD/logs/supervisor.log")" -ge 2 ] &&
        "$CTL" -r "$S" status 2>/dev/null | grep -Eq "^coordinator +[0-9]+ +ready " &&
        [ "$(cat "$SD/coordinator.pid")" != "${stuck[0]}" ] && [ "$(cat "$SD/io-worker.pid")" != "${stuck[1]}" ] &&
        { ok=0; break; }
    sleep 0.2
done
check "the supervisor restarts the stalled coordinator and io-worker, and says why" $ok
[ $ok -eq 0 ] || tail -n 5 "$SD/logs/supervisor.log"
after=$(gen "$S" 16)
[ -n "$after" ] && [ "$after" == "$before" ]
check "... and the stack then generates the same text (the workers registered again)" $?
"$PI2" down -r "$S" >/dev/null 2>&1

finish
[ $fail -eq 0 ]
