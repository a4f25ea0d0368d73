#!/usr/bin/env bash
# mkmodel: tensors, types and shapes as gguf-info reports them, the bamboo
# architecture's metadata, determinism
# (same seed -> same bytes whatever the thread count, other seed -> other
# bytes), and the planted firing statistics measured by the reference engine.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
MK="$BUILD/bin/mkmodel"
INFO="$BUILD/bin/gguf-info"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0; fail=0
check() { # check NAME CONDITION-EXIT-STATUS
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; fi
}
# in_range VALUE LO HI: exit status 0 if LO <= VALUE <= HI
in_range() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v != "" && v + 0 >= lo && v + 0 <= hi) }'; }
# field KEY FILE: value of KEY=... on the summary line
field() { sed -n 's/^summary:.* '"$1"'=\([0-9.]*\).*/\1/p' "$2"; }

if [ ! -x "$MK" ] || [ ! -x "$INFO" ]; then
    echo "FAIL missing $MK or $INFO (build first)"
    echo "0 passed, 1 failed"
    exit 1
fi

"$MK" -h | grep -q -- '--measure'; check "mkmodel -h prints the options" $?
"$MK" -o "$TMP/x.gguf" --fire 2 2>/dev/null; [ $? -ne 0 ]; check "--fire 2 is refused" $?
"$MK" -o "$TMP/x.gguf" --type q5_k 2>/dev/null; [ $? -ne 0 ]; check "--type q5_k is refused" $?
"$MK" -o "$TMP/x.gguf" --dim 100 2>/dev/null; [ $? -ne 0 ]; check "--dim 100 (not a multiple of 32) is refused" $?

# --- tensors, types and shapes of tiny models (dim 64, 2 layers, 4 heads, 2 kv heads, ff 96) ---
SHAPE="--dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 96 --vocab 400 --ctx 128"
# expect NAME TYPE SHAPE in the gguf-info listing
expect() { grep -Eq "^ +[0-9]+ +$1 +$2 +$3( |$)" "$4"; }
for act in relu silu; do
    for t in f32 f16 q8_0 q4_0; do
        f="$TMP/tiny-$act-$t.gguf"
        "$MK" -o "$f" $SHAPE --act "$act" --type "$t" 2>"$TMP/log"; check "generate $act $t" $?
        "$INFO" "$f" >"$TMP/info" 2>&1; check "gguf-info reads $act $t" $?
        expect token_embd.weight "$t" "64 x 400" "$TMP/info"; check "$act $t token_embd" $?
        expect output.weight "$t" "64 x 400" "$TMP/info"; check "$act $t output" $?
        expect output_norm.weight f32 "64" "$TMP/info"; check "$act $t output_norm" $?
        for l in 0 1; do
            ok=0
            expect "blk.$l.attn_norm.weight" f32 "64" "$TMP/info" || ok=1
            expect "blk.$l.ffn_norm.weight" f32 "64" "$TMP/info" || ok=1
            expect "blk.$l.attn_q.weight" "$t" "64 x 64" "$TMP/info" || ok=1
            expect "blk.$l.attn_k.weight" "$t" "64 x 32" "$TMP/info" || ok=1
            expect "blk.$l.attn_v.weight" "$t" "64 x 32" "$TMP/info" || ok=1
            expect "blk.$l.attn_output.weight" "$t" "64 x 64" "$TMP/info" || ok=1
            expect "blk.$l.ffn_gate.weight" "$t" "64 x 96" "$TMP/info" || ok=1
            expect "blk.$l.ffn_up.weight" "$t" "64 x 96" "$TMP/info" || ok=1
            expect "blk.$l.ffn_down.weight" "$t" "96 x 64" "$TMP/info" || ok=1
            check "$act $t layer $l tensors" $ok
        done
        grep -q "tensors *21" "$TMP/info"; check "$act $t has 21 tensors" $?
        grep -q "pi2.ffn_activation = string \"$act\"" "$TMP/info"; check "$act $t activation key" $?
        grep -q 'general.architecture = string "llama"' "$TMP/info"; check "$act $t architecture" $?
        grep -q 'llama.attention.head_count_kv = uint32 2' "$TMP/info"; check "$act $t kv heads" $?
        grep -q 'tokenizer.ggml.tokens = string\[400\]' "$TMP/info"; check "$act $t vocabulary" $?
    done
done

# mixed types, tied output
f="$TMP/mixed.gguf"
"$MK" -o "$f" $SHAPE --type-embd q8_0 --type-attn f16 --type-ffn q4_0 --type-output f32 --tied 2>/dev/null
check "generate mixed/tied" $?
"$INFO" "$f" >"$TMP/info" 2>&1
expect token_embd.weight q8_0 "64 x 400" "$TMP/info" && expect blk.1.attn_v.weight f16 "64 x 32" "$TMP/info" &&
    expect blk.1.ffn_down.weight q4_0 "96 x 64" "$TMP/info" && ! grep -q ' output.weight ' "$TMP/info"
check "mixed types and tied output" $?

# PowerInfer file: PWRI magic, down transposed, predictor (tiny dim 64 -> subspace rank 8 -> predictor rank 18)
f="$TMP/pwri.gguf"
"$MK" -o "$f" $SHAPE --pwri --type q4_0 2>/dev/null; check "generate pwri" $?
"$INFO" "$f" >"$TMP/info" 2>&1
grep -q 'magic *PWRI' "$TMP/info" && expect blk.1.ffn_down_t.weight q4_0 "64 x 96" "$TMP/info" &&
    expect blk.1.fc1.weight f16 "64 x 18" "$TMP/info" && expect blk.1.fc2.weight f16 "18 x 96" "$TMP/info" &&
    grep -q 'powerinfer.sparse_threshold' "$TMP/info" && ! grep -q 'ffn_down.weight' "$TMP/info"
check "pwri tensors" $?

# bamboo: general.architecture and every hyperparameter under "bamboo.", the llama file's tensors
# (names, types, shapes, offsets), and no pi2.ffn_activation unless --act is given (bamboo implies relu2)
tensor_table() { sed -n '/^tensors/,$p' "$1"; }
"$MK" -o "$TMP/llama.gguf" $SHAPE 2>/dev/null && "$INFO" "$TMP/llama.gguf" >"$TMP/info-llama" 2>&1
"$MK" -o "$TMP/bamboo.gguf" $SHAPE --arch bamboo 2>/dev/null; check "generate bamboo" $?
"$INFO" "$TMP/bamboo.gguf" >"$TMP/info" 2>&1; check "gguf-info reads bamboo" $?
grep -q 'general.architecture = string "bamboo"' "$TMP/info"; check "bamboo architecture" $?
sed -n 's/^  llama\./  bamboo./p' "$TMP/info-llama" >"$TMP/keys-llama"
grep '^  bamboo\.' "$TMP/info" >"$TMP/keys-bamboo"
[ "$(wc -l <"$TMP/keys-llama")" -ge 10 ] && cmp -s "$TMP/keys-llama" "$TMP/keys-bamboo"
check "bamboo.* keys are the llama.* keys with the same values" $?
! grep -q '^  llama\.' "$TMP/info"; check "bamboo file has no llama.* keys" $?
! grep -q 'pi2.ffn_activation' "$TMP/info"; check "bamboo: no pi2.ffn_activation by default" $?
cmp -s <(tensor_table "$TMP/info-llama") <(tensor_table "$TMP/info"); check "bamboo tensors = llama tensors" $?
"$MK" -o "$TMP/bamboo-key.gguf" $SHAPE --arch bamboo --act relu2 2>/dev/null
"$INFO" "$TMP/bamboo-key.gguf" 2>&1 | grep -q 'pi2.ffn_activation = string "relu2"'
check "bamboo --act relu2 writes pi2.ffn_activation" $?
"$MK" -o "$TMP/x.gguf" --arch gpt2 2>/dev/null; [ $? -ne 0 ]; check "--arch gpt2 is refused" $?
"$MK" -o "$TMP/x.gguf" --act relu3 2>/dev/null; [ $? -ne 0 ]; check "--act relu3 is refused" $?
"$MK" -o "$TMP/x.gguf" --arch bamboo --act silu --pwri 2>/dev/null; [ $? -ne 0 ]; check "--pwri --act silu is refused" $?
# bamboo PWRI: the llama PWRI file's tensors
"$INFO" "$TMP/pwri.gguf" >"$TMP/info-llama" 2>&1
"$MK" -o "$TMP/bamboo-pwri.gguf" $SHAPE --arch bamboo --pwri 2>/dev/null; check "generate bamboo pwri" $?
"$INFO" "$TMP/bamboo-pwri.gguf" >"$TMP/info" 2>&1
grep -q 'magic *PWRI' "$TMP/info" && cmp -s <(tensor_table "$TMP/info-llama") <(tensor_table "$TMP/info")
check "bamboo pwri tensors = llama pwri tensors" $?

# --- determinism ---
"$MK" -o "$TMP/s1a.gguf" --preset tiny --seed 7 -t 1 2>/dev/null
"$MK" -o "$TMP/s1b.gguf" --preset tiny --seed 7 -t 2 2>/dev/null
"$MK" -o "$TMP/s2.gguf" --preset tiny --seed 8 -t 2 2>/dev/null
h1=$(sha256sum <"$TMP/s1a.gguf"); h1b=$(sha256sum <"$TMP/s1b.gguf"); h2=$(sha256sum <"$TMP/s2.gguf")
[ "$h1" = "$h1b" ]; check "same seed, 1 vs 2 threads: identical files" $?
[ "$h1" != "$h2" ]; check "different seed: different files" $?

# --- planted statistics, measured by the reference engine (independent of the generator) ---
f="$TMP/stats.gguf"
"$MK" -o "$f" --dim 256 --ff 2048 --layers 4 --heads 4 --kv-heads 4 --vocab 2048 --ctx 512 \
    --fire 0.10 --hot 0.20:0.80 --measure 384 -t 1 >"$TMP/measure" 2>"$TMP/log"
check "generate and measure a ReLU model" $?
cat "$TMP/measure"
fire=$(field fire "$TMP/measure"); hot=$(field hot_share "$TMP/measure")
in_range "$fire" 0.06 0.14; check "fire $fire within 0.06-0.14 (target 0.10)" $?
in_range "$hot" 0.70 0.90; check "hot-20% share $hot within 0.70-0.90 (target 0.80)" $?
layers_ok=$(awk '/^ +[0-9]+ +[0-9.]+ +[0-9.]+/ { n++; if ($2 < 0.06 || $2 > 0.14 || $3 < 0.70 || $3 > 0.90) bad++ }
                 END { print (n == 4 && !bad) ? 0 : 1 }' "$TMP/measure")
check "every layer within the bounds" "$layers_ok"

# other targets move the statistics with them
"$MK" -o "$f" --dim 256 --ff 2048 --layers 2 --heads 4 --kv-heads 4 --vocab 2048 --ctx 512 \
    --fire 0.25 --hot 0.20:0.50 --measure 256 -t 1 >"$TMP/measure" 2>"$TMP/log"
check "generate and measure fire 0.25 hot 0.20:0.50" $?
fire=$(field fire "$TMP/measure"); hot=$(field hot_share "$TMP/measure")
in_range "$fire" 0.20 0.30; check "fire $fire within 0.20-0.30 (target 0.25)" $?
in_range "$hot" 0.42 0.58; check "hot share $hot within 0.42-0.58 (target 0.50)" $?

# ReLU² (bamboo): the gate is planted for 0.10; relu(up), independent of the gate, zeroes about
# half of those neurons (measured 0.050); the hot neurons keep their share (thinned counts bias it up a little)
"$MK" -o "$f" --dim 256 --ff 2048 --layers 2 --heads 4 --kv-heads 4 --vocab 2048 --ctx 512 --arch bamboo \
    --measure 256 -t 1 >"$TMP/measure" 2>"$TMP/log"
check "generate and measure a bamboo model" $?
grep -q 'activation relu2' "$TMP/measure"; check "bamboo measured with activation relu2" $?
fire=$(field fire "$TMP/measure"); hot=$(field hot_share "$TMP/measure")
in_range "$fire" 0.035 0.065; check "bamboo fire $fire within 0.035-0.065 (half of 0.10)" $?
in_range "$hot" 0.70 0.92; check "bamboo hot-20% share $hot within 0.70-0.92" $?

# SiLU: runs with finite logits (measure fails otherwise); every neuron is non-zero
"$MK" -o "$f" --preset tiny --act silu --measure 32 -t 1 >"$TMP/measure" 2>"$TMP/log"
check "SiLU model runs with finite logits" $?
fire=$(field fire "$TMP/measure")
in_range "$fire" 0.99 1.0; check "SiLU fire $fire is ~1" $?

# the predictor of a PWRI model agrees with the true firing most of the time
"$MK" -o "$f" --dim 256 --ff 1024 --layers 2 --heads 4 --kv-heads 4 --vocab 1024 --ctx 256 --pwri \
    --measure 128 -t 1 >"$TMP/measure" 2>"$TMP/log"
check "generate and measure a PWRI model" $?
recall=$(field pred_recall "$TMP/measure"); precision=$(field pred_precision "$TMP/measure")
in_range "$recall" 0.7 1.0; check "predictor recall $recall >= 0.7" $?
in_range "$precision" 0.7 1.0; check "predictor precision $precision >= 0.7" $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
