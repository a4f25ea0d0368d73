#!/usr/bin/env bash
# A prompt whose prefill takes longer than any fixed time per step: the
# npu-worker reports each layer it finishes, the coordinator judges it by that
# progress and the client hears PromptProgress while it waits. Each layer of
# a prefill is made 1.2 s slow (PI2_TASK_DELAY_US), so one 16-token chunk of
# stories260K's 5 layers lasts 6 s: longer than the 5 s in which a step used
# to have to complete, than the 3 s the coordinator allows here without a
# finished layer (prefill-stall=3000), and than the client's 3 s of silence
# (the cpu-workers' tasks get the same delay, hence a single generated token).
# The prompt is longer than max-prefill (chunks), the text equals pi2-ref's,
# progress and the time to first token are shown, and a kill -9 of the
# npu-worker in the middle of the prefill leaves the text unchanged.
set -u
cd "$(dirname "$0")/.." || exit 1
SHARED=${PI2_SHARED:-../shared}
MODEL=$SHARED/oracle/stories260K.gguf
RUN_BASE="tp$$"
# shellcheck source=tests/sh/stack_common.sh
. tests/sh/stack_common.sh

require_programs pi2 pi2-ref cachemgr io-worker coordinator npu-worker cpu-worker pi2-ctl pi2-client
if [ ! -f "$MODEL" ]; then
    check "model $MODEL exists (PI2_SHARED)" 1
    exit 1
fi

{ printf 'max-prefill=16\nprefill-stall=3000\n'; cat "$TMP/two.conf"; } >"$TMP/prefill.conf"
PROMPT="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends."
# one token: it comes from the prefill's logits, so no decode task (which the
# same delay would make 6 s long per token) runs
N=1
want=$("$REF" -m "$MODEL" -p "$PROMPT" -n $N -c 512 -t 2 --temp 0 2>/dev/null)
n_prompt=$("$REF" -m "$MODEL" -p "$PROMPT" -n 1 -c 512 -t 2 --temp 0 2>&1 >/dev/null |
    sed -n 's/.*prompt: \([0-9]*\) tokens.*/\1/p' | head -n 1)
[ -n "$n_prompt" ] && [ "$n_prompt" -gt 16 ]
check "the prompt ($n_prompt tokens) is longer than max-prefill 16" $?

export PI2_TASK_DELAY_US=1200000
new_run R
up "$R" "$TMP/prefill.conf" "$MODEL"
check "pi2 up with 1.2 s per prefill layer" $?
RD=$("$PI2" rundir -r "$R")

t0=$(date +%s.%N)
got=$(timeout 120 "$PI2" run -r "$R" -p "$PROMPT" -n $N --temp 0 --timeout 3 2>"$TMP/run.err")
took=$(echo "$(date +%s.%N) - $t0" | bc)
[ -n "$got" ] && [ "$got" == "$want" ]
check "a prefill of $took s in 6 s chunks, client silence limit 3 s: text == pi2-ref" $?
[ "$got" == "$want" ] || { printf 'expected: %q\ngot:      %q\n' "$want" "$got"; tail -n 5 "$TMP/run.err"; dump_logs "$R"; }
awk -v t="$took" 'BEGIN { exit !(t >= 10) }'
check "each chunk really took longer than the old 5 s limit (all: $took s)" $?
grep -Eq "prompt: [0-9]+/$n_prompt tokens \([0-9]+ %\), [0-9.]+ tok/s" "$TMP/run.err"
check "pi2 run shows the prompt's progress on stderr" $?
grep -Eq "prompt: $n_prompt tokens in [0-9.]+ s .*time to first token [0-9.]+ s" "$TMP/run.err"
check "pi2 run's timing line gives the time to first token" $?
grep -Eq 'prompt: [1-9][0-9]*/' "$TMP/run.err"
check "progress counts tokens done before the prompt ends" $?
! "$PI2" logs coordinator -r "$R" | grep -q 're-sending the step'
check "the coordinator re-sent nothing: progress kept the steps alive" $?

# kill -9 of the npu-worker 3 s into the prefill: the coordinator waits for it
# to come back, re-sends the chunk, and the text does not change
victim=$(cat "$RD/npu-worker.pid")
timeout 120 "$PI2" run -r "$R" -p "$PROMPT" -n $N --temp 0 --timeout 10 >"$TMP/killed.out" 2>"$TMP/killed.err" &
client=$!
sleep 3
kill -0 "$client" 2>/dev/null
check "npu-worker kill: the prefill is still running 3 s in" $?
kill -9 "$victim"
wait "$client"
check "npu-worker killed mid-prefill: the client succeeds" $?
[ "$(cat "$TMP/killed.out")" == "$want" ]
check "npu-worker killed mid-prefill: text == pi2-ref" $?
[ "$(cat "$TMP/killed.out")" == "$want" ] || { tail -n 5 "$TMP/killed.err"; dump_logs "$R"; }
restarted "$RD" npu-worker "$victim"
check "npu-worker killed: the supervisor restarted it" $?
