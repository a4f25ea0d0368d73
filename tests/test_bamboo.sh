#!/usr/bin/env bash
# Architecture "bamboo" (PowerInfer's ReLU² models), on tiny mkmodel files:
#   - it loads with the "bamboo.*" hyperparameters and activation relu2, both
#     implied by the architecture (no pi2.ffn_activation key) and written out;
#     the same weights under "llama" with the key relu2 give the same text, and
#     "bamboo" with the key relu gives the text of the llama ReLU file;
#   - pi2-ref generates text greedily;
#   - gate-first gives the dense greedy text exactly (F32, Q8_0, PWRI);
#   - a bamboo PWRI file runs in the stack in predictor mode and `pi2 run`
#     prints pi2-ref's predictor text byte for byte; nothing is left behind.
set -u
cd "$(dirname "$0")/.." || exit 1
RUN_BASE="tbb$$"
# shellcheck source=tests/sh/stack_common.sh
. tests/sh/stack_common.sh
MK=$BIN/mkmodel
INFO=$BIN/gguf-info

require_programs pi2 pi2-ref mkmodel gguf-info cachemgr io-worker coordinator npu-worker cpu-worker pi2-client

PROMPT="Once upon"
# Texts may hold any byte (random models, byte tokens): compared as files.
ref() { # ref OUT MODEL [flags]: pi2-ref's greedy text into OUT, its log into OUT.log
    local out=$1 model=$2
    shift 2
    "$REF" -m "$model" -p "$PROMPT" -n 24 --temp 0 -c 512 -t 2 "$@" >"$out" 2>"$out.log"
}
same() { # same NAME A B: both non-empty and byte-identical
    if [ -s "$2" ] && cmp -s "$2" "$3"; then
        check "$1" 0
    else
        check "$1" 1
        echo "  $2: $(cat -v "$2")"
        echo "  $3: $(cat -v "$3")"
    fi
}
mk() { # mk OUT [flags]
    local out=$1
    shift
    "$MK" -o "$out" "$@" 2>"$TMP/mk.log" || { echo "mkmodel $* failed:"; cat "$TMP/mk.log"; return 1; }
}

# ---- (a) metadata and loading ----
B=$TMP/bamboo.gguf
mk "$B" --arch bamboo; check "mkmodel --arch bamboo" $?
"$INFO" "$B" >"$TMP/info" 2>&1; check "gguf-info reads the bamboo file" $?
grep -q 'general.architecture = string "bamboo"' "$TMP/info"; check "architecture bamboo" $?
ok=0
for kv in "block_count = uint32 2" "embedding_length = uint32 128" "feed_forward_length = uint32 512" \
    "attention.head_count = uint32 4" "attention.head_count_kv = uint32 2" "context_length = uint32 512" \
    "rope.dimension_count = uint32 32"; do
    grep -q "^  bamboo\.$kv\$" "$TMP/info" || { echo "missing bamboo.$kv"; ok=1; }
done
check "hyperparameters under bamboo.*" $ok
! grep -q '^  llama\.' "$TMP/info"; check "no llama.* keys" $?
! grep -q 'pi2.ffn_activation' "$TMP/info"; check "no pi2.ffn_activation: the architecture implies relu2" $?

# (b) pi2-ref loads it (model_load: the log names arch, shape and activation) and generates
ref "$TMP/bamboo.txt" "$B"; check "pi2-ref --temp 0 on bamboo exits 0" $?
grep -q 'bamboo, 2 layers, dim 128, ffn 512 (relu2, dense), vocab 512, ctx 512' "$TMP/bamboo.txt.log"
check "model_load: bamboo, 2 layers, dim 128, ffn 512, relu2, vocab 512, ctx 512" $?
head -c ${#PROMPT} "$TMP/bamboo.txt" | cmp -s - <(printf '%s' "$PROMPT") &&
    [ "$(wc -c <"$TMP/bamboo.txt")" -gt $((${#PROMPT} + 8)) ]
check "pi2-ref generates text after the prompt" $?

# another shape: every dimension comes from bamboo.* (kv heads 2 of 4 is checked by the attn_k shape)
mk "$TMP/shape.gguf" --arch bamboo --dim 64 --layers 3 --heads 4 --kv-heads 2 --ff 96 --vocab 400 --ctx 128
ref "$TMP/shape.txt" "$TMP/shape.gguf" -c 128
grep -q 'bamboo, 3 layers, dim 64, ffn 96 (relu2, dense), vocab 400, ctx 128' "$TMP/shape.txt.log"
check "model_load of a 3-layer dim-64 ff-96 bamboo file" $?

# the activation written explicitly, or the same weights under the llama prefix, give the same text
mk "$TMP/bamboo-key.gguf" --arch bamboo --act relu2
"$INFO" "$TMP/bamboo-key.gguf" 2>&1 | grep -q 'pi2.ffn_activation = string "relu2"'; check "--act relu2 writes the key" $?
ref "$TMP/bamboo-key.txt" "$TMP/bamboo-key.gguf"
same "bamboo with pi2.ffn_activation relu2 = bamboo by default" "$TMP/bamboo.txt" "$TMP/bamboo-key.txt"
mk "$TMP/llama-relu2.gguf" --arch llama --act relu2
ref "$TMP/llama-relu2.txt" "$TMP/llama-relu2.gguf"
grep -q 'llama, 2 layers, dim 128, ffn 512 (relu2' "$TMP/llama-relu2.txt.log"; check "llama with key relu2 loads as relu2" $?
same "llama relu2 = bamboo (same weights)" "$TMP/bamboo.txt" "$TMP/llama-relu2.txt"
mk "$TMP/bamboo-relu.gguf" --arch bamboo --act relu
mk "$TMP/llama-relu.gguf"
ref "$TMP/bamboo-relu.txt" "$TMP/bamboo-relu.gguf"
ref "$TMP/llama-relu.txt" "$TMP/llama-relu.gguf"
grep -q 'bamboo, 2 layers, dim 128, ffn 512 (relu,' "$TMP/bamboo-relu.txt.log"; check "bamboo with key relu loads as relu" $?
same "bamboo with key relu = llama relu" "$TMP/llama-relu.txt" "$TMP/bamboo-relu.txt"

# ---- (c) gate-first is exact: the dense greedy text (Q4_0 GGUF is not: gate-first requantizes down to Q8_0) ----
mk "$TMP/bamboo-f32.gguf" --arch bamboo --type f32
mk "$TMP/bamboo-q8.gguf" --arch bamboo --type q8_0
P=$TMP/bamboo-pwri.gguf
mk "$P" --arch bamboo --pwri; check "mkmodel --arch bamboo --pwri" $?
for m in "$TMP/bamboo-f32.gguf" "$TMP/bamboo-q8.gguf" "$P"; do
    n=$(basename "$m" .gguf)
    ref "$TMP/$n-dense.txt" "$m" --ffn dense
    ref "$TMP/$n-gf.txt" "$m" --ffn gate-first; check "$n: pi2-ref --ffn gate-first runs" $?
    same "$n: gate-first text = dense text" "$TMP/$n-dense.txt" "$TMP/$n-gf.txt"
    # relu(up) halves the planted 0.10 of relu(gate)
    frac=$(sed -n 's/.*gate-first FFN: active fraction \([0-9.]*\).*/\1/p' "$TMP/$n-gf.txt.log")
    awk -v v="$frac" 'BEGIN { exit !(v != "" && v >= 0.02 && v <= 0.08) }'
    check "$n: gate-first active fraction $frac within 0.02-0.08 (relu2 of a 0.10 gate)" $?
done

# ---- (d) the stack on a bamboo PWRI file: predictor mode, pi2-ref's text ----
ref "$TMP/pwri-pred.txt" "$P" --ffn predictor; check "pi2-ref --ffn predictor on bamboo PWRI" $?
# seed 1 is one where the predictor's misses change the text: a stack running dense would show
! cmp -s "$TMP/pwri-pred.txt" "$TMP/bamboo-pwri-dense.txt"; check "predictor and dense texts differ (the check has teeth)" $?
new_run R
if "$PI2" up -m "$P" -r "$R" --ctx 512 --timeout 60 >"$TMP/up.log" 2>&1; then
    check "pi2 up on the bamboo PWRI file" 0
    mode=$("$PI2" logs cachemgr -r "$R" 2>/dev/null | sed -n 's/.*FFN mode of the stack: \([a-z-]*\).*/\1/p' | tail -n 1)
    [ "$mode" = predictor ]; check "the stack's FFN mode is predictor (got '$mode')" $?
    timeout 120 "$PI2" run -r "$R" -p "$PROMPT" -n 24 --temp 0 >"$TMP/stack.txt" 2>"$TMP/run.err"
    check "pi2 run exits 0" $?
    same "pi2 run = pi2-ref --ffn predictor, byte for byte" "$TMP/pwri-pred.txt" "$TMP/stack.txt"
    cmp -s "$TMP/pwri-pred.txt" "$TMP/stack.txt" || dump_logs "$R"
    "$PI2" down -r "$R" >/dev/null 2>&1; check "pi2 down" $?
    no_leftovers "$R"; check "no process, segment or run directory left" $?
else
    check "pi2 up on the bamboo PWRI file" 1
    tail -n 30 "$TMP/up.log"
fi

# ---- refusals ----
"$MK" -o "$TMP/x.gguf" --arch mistral 2>/dev/null; [ $? -ne 0 ]; check "--arch mistral is refused" $?
"$MK" -o "$TMP/x.gguf" --arch bamboo --act silu --pwri 2>/dev/null; [ $? -ne 0 ]
check "--pwri with --act silu is refused" $?
