# shellcheck shell=bash
# Sourced by the benchmarks that time pi2 stacks (bench/sparse-decode,
# bench/stack-overhead, bench/ab-stacks): a temporary directory, stacks that
# are taken down on exit, timing parsed from the generation lines, medians.
# (Not in a subdirectory: `shellcheck -x bench/*` would stop at it.)
# The caller sets BENCH_PI2 (a pi2 binary) before bench_stack_up; each stack
# keeps the pi2 it came up with, so two builds can run side by side.

declare -gA BENCH_PI2_OF=() # run id -> the pi2 that brought it up

# bench_init: BENCH_TMP (removed on exit), BENCH_CONF (a two-worker config in
# it) and the exit trap that takes down every stack still up
bench_init() {
    BENCH_TMP=$(mktemp -d)
    BENCH_CONF=$BENCH_TMP/two.conf
    bench_conf_two_workers "$BENCH_CONF"
    trap bench_cleanup EXIT
}
bench_cleanup() {
    local id
    for id in "${!BENCH_PI2_OF[@]}"; do "${BENCH_PI2_OF[$id]}" down -r "$id" >/dev/null 2>&1 || true; done
    rm -rf "$BENCH_TMP"
}

# bench_conf FILE LINE...: a stack config, cachemgr, io-worker and coordinator on CPU 0, then LINE...
bench_conf() {
    local file=$1
    shift
    printf '%s\n' "cachemgr cpus=0" "io-worker cpus=0" "coordinator cpus=0" "$@" >"$file"
}
# bench_conf_two_workers FILE [LINE...]: bench_conf with LINE... and then
# 2 cpu-workers x 1 thread pinned to CPUs 0 and 1
bench_conf_two_workers() {
    local file=$1
    shift
    bench_conf "$file" "$@" "cpu-worker cpus=0 threads=1" "cpu-worker cpus=1 threads=1"
}

bench_run_id() { printf 'bench-%s-%s\n' "$$" "$1"; } # bench_run_id NAME: the run id of stack NAME

# bench_stack_up NAME MODEL [pi2 up flags]: a stack of $BENCH_PI2 on BENCH_CONF,
# --ctx 256; the flags come last, so they may override (-c FILE, --ctx N)
bench_stack_up() {
    local id model=$2
    id=$(bench_run_id "$1")
    shift 2
    BENCH_PI2_OF[$id]=$BENCH_PI2
    "$BENCH_PI2" up -m "$model" -c "$BENCH_CONF" -r "$id" --ctx 256 --timeout 600 "$@" 2>"$BENCH_TMP/up.log" ||
        { cat "$BENCH_TMP/up.log" >&2; exit 1; }
}
bench_stack_down() { # bench_stack_down NAME
    local id
    id=$(bench_run_id "$1")
    "${BENCH_PI2_OF[$id]}" down -r "$id" >/dev/null
    unset "BENCH_PI2_OF[$id]"
}

# bench_gen NAME [pi2 run flags]: one generation on stack NAME; its stderr
# (with the timing line) left in BENCH_TMP/gen.err
bench_gen() {
    local id
    id=$(bench_run_id "$1")
    shift
    "${BENCH_PI2_OF[$id]}" run -r "$id" "$@" >/dev/null 2>"$BENCH_TMP/gen.err" ||
        { cat "$BENCH_TMP/gen.err" >&2; exit 1; }
}
# bench_gen_ms NAME [pi2 run flags]: bench_gen, then prints its decode ms/token
bench_gen_ms() {
    bench_gen "$@"
    local ms
    ms=$(bench_ms_per_token <"$BENCH_TMP/gen.err")
    [ -n "$ms" ] || { cat "$BENCH_TMP/gen.err" >&2; echo "bench: no timing line from pi2 run" >&2; exit 1; }
    echo "$ms"
}
# bench_ms_per_token: decode ms/token of each timing line on stdin (pi2 run's and pi2-ref's), e.g.
# "prompt: 5 tokens in 0.9 s (5.4 tok/s); generated: 32 tokens in 2.1 s (15.2 tok/s)" -> 65.625000
bench_ms_per_token() {
    sed -n 's/.*generated: \([0-9]*\) tokens in \([0-9.]*\) s.*/\2 \1/p' | awk '{ printf "%.6f\n", 1000 * $1 / $2 }'
}

# bench_median: of the numbers on stdin, one a line: "MIN MEDIAN MAX COUNT"
bench_median() {
    sort -g | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.10g %.10g %.10g %d\n", v[1], m, v[NR], NR }'
}

# bench_prompt N: a prompt of exactly N tokens (BOS included) for the 7B files
# (their synthetic vocabulary: mkmodel builds it from the vocabulary size
# alone), made once word by word with pi2-ref ($REF) and kept in DIR
bench_prompt() {
    local n=$1 out=$DIR/prompt-$1.txt vocab=$DIR/vocab-32000.gguf text="" count=0 w
    if [ -s "$out" ]; then cat "$out"; return; fi
    [ -s "$vocab" ] || "$BUILD"/bin/mkmodel -o "$vocab" --preset tiny --vocab 32000 --seed 7 >/dev/null 2>&1
    local words=(Once upon a time in a small village by the sea there lived an old fisherman who
        told stories to the children every evening about storms ships whales and islands far away
        where the sun never set and the rivers ran with honey and the mountains sang at night)
    local i=0 c
    # a word that would overshoot is skipped: a shorter one may land exactly on n
    while ((count < n && i < 4 * n + 100)); do
        w=${words[i % ${#words[@]}]}; i=$((i + 1))
        c=$("$REF" -m "$vocab" -p "$text${text:+ }$w" -n 1 -t 1 -c 2048 --temp 0 2>&1 >/dev/null |
            sed -n 's/.*prompt: \([0-9]*\) tokens.*/\1/p')
        if ((c <= n)); then text="$text${text:+ }$w" count=$c; fi
    done
    [ "$count" -eq "$n" ] || { echo "bench: could not make a prompt of $n tokens (got $count)" >&2; exit 1; }
    printf '%s' "$text" >"$out"
    cat "$out"
}

# bench_llama_tg GGUF N [WRAPPER...]: llama.cpp's decode tok/s (llama-bench's tg, 2 threads, N tokens, one
# repetition, mmap) on GGUF with the llama-bench that LLAMA_BENCH names, run through WRAPPER (e.g. a
# cgroup). Prints the tok/s, or returns 1 with its last error line in BENCH_TMP/llama.err.
bench_llama_tg() {
    local gguf=$1 n=$2
    shift 2
    "$@" env LD_LIBRARY_PATH="$(dirname "$LLAMA_BENCH")" "$LLAMA_BENCH" -m "$gguf" -t 2 -p 0 -n "$n" -r 1 -mmp 1 \
        -o csv >"$BENCH_TMP/llama.csv" 2>"$BENCH_TMP/llama.err" || return 1
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ /avg_ts/) c = i }
             NR > 1 && c { gsub(/"/, "", $c); v = $c } END { print v }' "$BENCH_TMP/llama.csv"
}
