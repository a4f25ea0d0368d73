#!/usr/bin/env bash
# cachemgr + io-worker + pi2-ctl as processes: the weights segment holds the
# model file's bytes (checked with cmp against the file, at the data offset
# gguf-info reports); a kill -9 of the io-worker while it holds a read batch
# and of cachemgr after the load are survived; another model is refused on a
# live run; SIGTERM exits 0; cleanup leaves no segment, run dir or process.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
BIN=$BUILD/bin
SHARED=${PI2_SHARED:-../shared}
MODEL=$SHARED/oracle/synth-q4_0.gguf
OTHER=$SHARED/oracle/synth-q8_0.gguf
RUN=test-cm-$$
TMP=$(mktemp -d)
pids=()
pass=0; fail=0
check() { # check NAME EXIT-STATUS
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; fi
}
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    for r in "$RUN" "$RUN-big"; do "$BIN/pi2-ctl" -r "$r" cleanup >/dev/null 2>&1; done
    rm -rf "$TMP"
}
trap cleanup EXIT

for b in cachemgr io-worker pi2-ctl gguf-info mkmodel; do
    if [ ! -x "$BIN/$b" ]; then echo "FAIL missing $BIN/$b (build first)"; echo "0 passed, 1 failed"; exit 1; fi
done

# start NAME RUN [args...]: background process, log in $TMP/NAME.log, pid in $last
start() {
    local name=$1; shift
    "$BIN/$@" 2>>"$TMP/$name.log" &
    last=$!
    pids+=("$last")
}
# stop PID: SIGTERM, then the exit status
stop() { kill -TERM "$1" 2>/dev/null; wait "$1"; }

# weights_match RUN MODEL: the data region equals the file from the 4 KiB-aligned data offset, then zeros
weights_match() {
    local run=$1 model=$2 size data start off region
    size=$(stat -L -c %s "$model")
    data=$("$BIN/gguf-info" "$model" | sed -n 's/^data *at offset \([0-9]*\),.*/\1/p')
    start=$((data / 4096 * 4096))
    read -r off region < <("$BIN/pi2-ctl" -r "$run" status |
        awk -v seg="/pi2-$run-weights" '$1 == seg { w = 1 } w && $1 == "region" && $2 == "data" { print $4, $6; exit }')
    [ -n "$off" ] && [ "$region" -eq $(((size - start + 4095) / 4096 * 4096)) ] || return 1
    cmp -s -n $((size - start)) -i "$start:$off" "$model" "/dev/shm/pi2-$run-weights" || return 1
    cmp -s -n $((region - (size - start))) -i "$((off + size - start)):0" "/dev/shm/pi2-$run-weights" /dev/zero
}
row() { "$BIN/pi2-ctl" -r "$1" status | awk -v n="$2" '$1 == n'; } # row RUN NAME
ready_gen() { "$BIN/pi2-ctl" -r "$1" status | awk '$1 == "weights_ready" { print $2 }'; }

"$BIN/cachemgr" -h | grep -q -- '--cpu-workers'; check "cachemgr -h" $?
"$BIN/io-worker" -h | grep -q -- '--queue-depth'; check "io-worker -h" $?
"$BIN/pi2-ctl" -r "$RUN" status >/dev/null 2>"$TMP/err"; [ $? -ne 0 ] && grep -q "does not exist" "$TMP/err"
check "pi2-ctl status of a missing run: clear error" $?
"$BIN/pi2-ctl" -r "$RUN" wait-ready --timeout 0.2 2>/dev/null; [ $? -ne 0 ]; check "wait-ready times out" $?

# --- load, verify, restart cachemgr ---
start io io-worker -m "$MODEL" -r "$RUN"; io=$last
start cm cachemgr -m "$MODEL" -r "$RUN" -c 256; cm=$last
"$BIN/pi2-ctl" -r "$RUN" wait-ready --timeout 30 >/dev/null; check "weights become ready" $?
weights_match "$RUN" "$MODEL"; check "the weights segment holds the model file's bytes" $?
gen=$(ready_gen "$RUN")
[ -n "$gen" ] && [ "$gen" != 0 ]; check "weights_ready is a non-zero generation" $?
grep -q "prefaulted in .* GB/s" "$TMP/cm.log" && grep -q "weights loaded: .* GB/s" "$TMP/cm.log"
check "cachemgr logs the prefault and load throughput" $?
sleep 0.3
row "$RUN" cachemgr | grep -q " ready "; check "status: cachemgr ready" $?
row "$RUN" io-worker | grep -q " ready "; check "status: io-worker ready" $?
age=$(row "$RUN" io-worker | awk '{ print $4 }')
[ -n "$age" ] && [ "$age" -le 1000 ]; check "status: io-worker heartbeat is fresh ($age ms)" $?

"$BIN/cachemgr" -m "$OTHER" -r "$RUN" 2>"$TMP/other.log"; [ $? -ne 0 ] && grep -q "cannot be kept" "$TMP/other.log"
check "a cachemgr with another model is refused on the live run" $?

kill -9 "$cm"; wait "$cm" 2>/dev/null
segs_before=$(ls /dev/shm | grep -c "^pi2-$RUN-")
[ "$segs_before" -eq 4 ]; check "four segments survive cachemgr's kill -9" $?
start cm cachemgr -m "$MODEL" -r "$RUN"; cm=$last
sleep 1
grep -q "weights already loaded" "$TMP/cm.log"; check "restarted cachemgr keeps the loaded weights" $?
[ "$(ready_gen "$RUN")" = "$gen" ]; check "weights_ready kept across the restart" $?
"$BIN/pi2-ctl" -r "$RUN" status | grep -q "n_ctx 256"; check "the run's parameters are kept" $?
row "$RUN" cachemgr | awk '{ exit !($3 == "ready" && $6 == 1) }'; check "status: cachemgr restarted once" $?
weights_match "$RUN" "$MODEL"; check "weights unchanged after the restart" $?

stop "$cm"; check "cachemgr: SIGTERM exits 0" $?
stop "$io"; check "io-worker: SIGTERM exits 0" $?
[ "$(ls /dev/shm | grep -c "^pi2-$RUN-")" -eq 4 ]; check "segments stay after SIGTERM" $?
"$BIN/pi2-ctl" -r "$RUN" cleanup >"$TMP/cleanup.out"; check "pi2-ctl cleanup" $?
[ "$(grep -c "removing segment" "$TMP/cleanup.out")" -eq 4 ] && grep -q "removed run directory" "$TMP/cleanup.out"
check "cleanup lists what it removed" $?

# --- kill -9 of the io-worker while it holds a batch of a bigger model ---
BIG=$TMP/small.gguf
"$BIN/mkmodel" -o "$BIG" --preset small 2>/dev/null; check "mkmodel --preset small" $?
start cm2 cachemgr -m "$BIG" -r "$RUN-big" --io-timeout-ms 1000 --small-pages; cm=$last
PI2_IO_DELAY_US=3000000 start io2 io-worker -m "$BIG" -r "$RUN-big"; io=$last
for _ in $(seq 100); do grep -q "loading" "$TMP/cm2.log" 2>/dev/null && break; sleep 0.05; done
sleep 0.5
[ "$(ready_gen "$RUN-big")" = 0 ]; check "load in progress when the io-worker is killed" $?
kill -9 "$io"; wait "$io" 2>/dev/null
start io2 io-worker -m "$BIG" -r "$RUN-big"; io=$last
"$BIN/pi2-ctl" -r "$RUN-big" wait-ready --timeout 30 >/dev/null; check "the load completes after the io-worker restarts" $?
grep -q "sending it again" "$TMP/cm2.log"; check "cachemgr re-sent the lost batch" $?
weights_match "$RUN-big" "$BIG"; check "the bigger model's bytes are all in the segment" $?
grep -q "weights: on 4 KiB pages (--small-pages)" "$TMP/cm2.log"; check "--small-pages: the weights stay on 4 KiB pages, logged" $?
stop "$cm"; stop "$io"
"$BIN/pi2-ctl" -r "$RUN-big" cleanup >/dev/null; check "cleanup of the second run" $?

# --- nothing left behind ---
[ -z "$(ls /dev/shm | grep "^pi2-$RUN")" ]; check "no /dev/shm/pi2-$RUN* segment left" $?
alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
[ $alive -eq 0 ]; check "no process left" $?
"$BIN/pi2-ctl" -r "$RUN" cleanup | grep -q "nothing to remove"; check "cleanup of a removed run is a no-op" $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
