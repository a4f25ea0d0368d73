#!/usr/bin/env bash
# `pi2 up` says what is wrong once: a missing, directory, truncated or
# malformed model, one of an architecture or tensor type the stack cannot
# run, a bad stack config, and a stack whose segments cannot fit in the memory
# cgroup are each refused before any process starts, with one line on stderr
# that names the file (and the field and offset, or both memory figures), a
# non-zero exit, nothing running and no segment left. A process that the
# kernel kills again and again (as the OOM killer does) stops the stack with
# one line saying so, from `pi2 up` while starting and in `pi2 status` later.
set -u
cd "$(dirname "$0")/.." || exit 1
SHARED=${PI2_SHARED:-../shared}
MODEL=$SHARED/oracle/stories260K.gguf
RUN_BASE="tu$$"
# shellcheck source=tests/sh/stack_common.sh
. tests/sh/stack_common.sh

require_programs pi2 cachemgr io-worker coordinator npu-worker cpu-worker pi2-ctl pi2-client
if [ ! -f "$MODEL" ]; then
    check "model $MODEL exists (PI2_SHARED)" 1
    exit 1
fi

# refused NAME PATTERN CMD...: CMD exits non-zero, prints exactly one line on
# stderr (none on stdout) and that line matches PATTERN (extended regex)
refused() {
    local name=$1 pattern=$2 rc
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    [ $rc -ne 0 ]; check "$name: non-zero exit ($rc)" $?
    [ "$(wc -l <"$TMP/err")" -eq 1 ] && [ ! -s "$TMP/out" ]
    check "$name: one line on stderr, nothing on stdout" $?
    grep -Eq -- "$pattern" "$TMP/err"
    check "$name: the line says '$pattern'" $?
    if [ "$(wc -l <"$TMP/err")" -ne 1 ] || ! grep -Eq -- "$pattern" "$TMP/err"; then
        echo "---- $name printed:"; head -n 20 "$TMP/err"
    fi
}

# gone NAME RUN: no process, no segment, no run directory of RUN
gone() {
    no_leftovers "$2"; check "$1: nothing running, no segment, no run directory" $?
}

# ---- models that cannot run: checked once, before any process ----
new_run R
refused "missing model" "^pi2: up: model $TMP/none.gguf: cannot read it$" "$PI2" up -m "$TMP/none.gguf" -r "$R"
gone "missing model" "$R"

mkdir "$TMP/dir.gguf"
refused "directory as model" "^pi2: up: $TMP/dir.gguf: not a regular file$" "$PI2" up -m "$TMP/dir.gguf" -r "$R"
gone "directory as model" "$R"

head -c 3000 "$MODEL" >"$TMP/trunc.gguf"
refused "truncated model" "^pi2: up: $TMP/trunc.gguf: .*'tokenizer\.ggml\.tokens'.* at offset [0-9]+: .*bytes left$" \
    "$PI2" up -m "$TMP/trunc.gguf" -r "$R"
gone "truncated model" "$R"

cp "$MODEL" "$TMP/magic.gguf"
printf 'GGUX' | dd of="$TMP/magic.gguf" bs=1 conv=notrunc status=none
refused "bad magic" "^pi2: up: $TMP/magic.gguf: .*magic.*offset 0" "$PI2" up -m "$TMP/magic.gguf" -r "$R"
gone "bad magic" "$R"

# byte_offset FILE STRING: where STRING first stands in FILE
byte_offset() { grep -obUa -- "$2" "$1" | head -n 1 | cut -d: -f1; }

# general.architecture "llama" -> "falcn": key (20 bytes), type (4), length (8), then the value
cp "$MODEL" "$TMP/arch.gguf"
off=$(byte_offset "$TMP/arch.gguf" general.architecture)
printf 'falcn' | dd of="$TMP/arch.gguf" bs=1 seek=$((off + 20 + 4 + 8)) conv=notrunc status=none
refused "unsupported architecture" "^pi2: up: $TMP/arch.gguf: architecture 'falcn' is not supported" \
    "$PI2" up -m "$TMP/arch.gguf" -r "$R"
gone "unsupported architecture" "$R"

# token_embd.weight's tensor info: name (17 bytes), n_dims (4), two dims (16), then its type -> 12 (q4_K)
cp "$MODEL" "$TMP/type.gguf"
off=$(byte_offset "$TMP/type.gguf" token_embd.weight)
printf '\x0c\x00\x00\x00' | dd of="$TMP/type.gguf" bs=1 seek=$((off + 17 + 4 + 16)) conv=notrunc status=none
refused "unsupported tensor type" \
    "^pi2: up: $TMP/type.gguf: tensor_info\[0\]\.type at offset $((off + 17 + 4 + 16)): .*q4_K \(12\) is not supported" \
    "$PI2" up -m "$TMP/type.gguf" -r "$R"
gone "unsupported tensor type" "$R"

refused "gate-first on a SiLU model" "^pi2: up: .*gate-first needs a ReLU model" \
    "$PI2" up -m "$MODEL" -r "$R" --ffn gate-first
gone "gate-first on a SiLU model" "$R"

# ---- a stack config the stack cannot run ----
printf 'cachemgr\nio-worker\ncoordinator\ncpu-worker threads=0\n' >"$TMP/bad.conf"
refused "bad stack config" "^pi2: $TMP/bad.conf:4: threads='0' is not an integer in \[1, 256\]$" \
    "$PI2" up -m "$MODEL" -c "$TMP/bad.conf" -r "$R"
gone "bad stack config" "$R"
printf 'cachemgr\nio-worker\ncoordinator\ncpu-worker\ncpu-worker\nsplit=1,2,3\n' >"$TMP/bad-split.conf"
refused "a split of 3 weights for 2 cpu-workers" "^pi2: $TMP/bad-split.conf: split=1,2,3 gives 3 weights for 2 cpu-workers$" \
    "$PI2" up -m "$MODEL" -c "$TMP/bad-split.conf" -r "$R"
gone "a split of 3 weights for 2 cpu-workers" "$R"
printf 'cachemgr\nio-worker\ncoordinator\ncpu-worker\nsplit=fast\n' >"$TMP/bad-split.conf"
refused "split=fast" "^pi2: $TMP/bad-split.conf:5: split='fast' is not auto, even or weights W0,W1,...$" \
    "$PI2" up -m "$MODEL" -c "$TMP/bad-split.conf" -r "$R"
gone "split=fast" "$R"

# ---- segments larger than the memory cgroup allows: refused before loading ----
CG_ROOT=/sys/fs/cgroup/memory
if [ "$(id -u)" = 0 ] && [ -w "$CG_ROOT" ] && mkdir "$CG_ROOT/pi2-$RUN_BASE" 2>/dev/null; then
    CG=$CG_ROOT/pi2-$RUN_BASE
    echo $((64 << 20)) >"$CG/memory.limit_in_bytes"
    # a KV cache of 300000 positions needs ~183 MiB of the 64 MiB
    refused "segments over the cgroup's cap" \
        "^pi2: up: .*stories260K\.gguf: the stack needs 1[0-9][0-9]\.[0-9] MiB of shared memory \(weights .* KV cache 1[0-9][0-9]\.[0-9] MiB at ctx 300000.*\) but may use 64\.0 MiB \(cgroup v1 /.*pi2-$RUN_BASE: .*limit.*\)$" \
        bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$CG" "$PI2" up -m "$MODEL" -r "$R" --ctx 300000
    gone "segments over the cgroup's cap" "$R"
    rmdir "$CG" 2>/dev/null
else
    skip "the memory-cgroup refusal (needs root and cgroup v1 at $CG_ROOT)"
fi

# ---- crash loops: a cachemgr the kernel kills at once, every time ----
# A copy of the programs whose cachemgr answers --check but is SIGKILLed as
# soon as it starts, as the OOM killer does to a process over its cap.
mkdir "$TMP/bin"
cp "$BIN"/pi2 "$BIN"/cachemgr "$BIN"/io-worker "$BIN"/coordinator "$BIN"/npu-worker "$BIN"/cpu-worker \
    "$BIN"/pi2-ctl "$BIN"/pi2-client "$TMP/bin/"
cp "$TMP/bin/cachemgr" "$TMP/bin/cachemgr.real"
cat >"$TMP/killed-cachemgr" <<'EOF'
#!/usr/bin/env bash
for a in "$@"; do [ "$a" = --check ] && exec "$(dirname "$0")/cachemgr.real" "$@"; done
kill -KILL $$
EOF
chmod +x "$TMP/killed-cachemgr"
cp "$TMP/killed-cachemgr" "$TMP/bin/cachemgr"

new_run R
t0=$(date +%s)
refused "cachemgr killed while starting" \
    "^pi2: the stack stopped while starting: cachemgr was killed by SIGKILL 3 times within [0-9]+ s: out of memory\? the stack needs [0-9.]+ MiB of shared memory, this process may use [0-9.]+ [GM]iB \(.+\)$" \
    "$TMP/bin/pi2" up -m "$MODEL" -c configs/default.conf -r "$R" --timeout 60
took=$(($(date +%s) - t0))
[ "$took" -lt 30 ]; check "the crash loop is seen in $took s, not at the 60 s timeout" $?
gone "cachemgr killed while starting" "$R"

# The same once the stack is up: a first kill -9 from outside, then each
# restart dies the same way; the supervisor stops the stack, pi2 status says why.
cp "$BIN/cachemgr" "$TMP/bin/cachemgr.new" && mv -f "$TMP/bin/cachemgr.new" "$TMP/bin/cachemgr"
new_run R
"$TMP/bin/pi2" up -m "$MODEL" -c configs/default.conf -r "$R" --timeout 60 >"$TMP/up.log" 2>&1
check "a stack on the copied programs comes up" $?
RD=$("$PI2" rundir -r "$R")
cp "$TMP/killed-cachemgr" "$TMP/bin/cachemgr.new" && mv -f "$TMP/bin/cachemgr.new" "$TMP/bin/cachemgr"
kill -9 "$(cat "$RD/cachemgr.pid")"
for _ in $(seq 100); do [ -f "$RD/stopped" ] && [ ! -f "$RD/supervisor.pid" ] && break; sleep 0.1; done
"$TMP/bin/pi2" status -r "$R" >"$TMP/status" 2>&1
grep -Eq "^supervisor: stopped the stack: cachemgr was killed by SIGKILL 3 times within [0-9]+ s: out of memory\?" "$TMP/status"
st=$?
check "pi2 status: the supervisor stopped the stack, and why" $st
[ $st -eq 0 ] || cat "$TMP/status"
[ -z "$(run_procs "$R")" ] && ! compgen -G "/dev/shm/pi2-$R-*" >/dev/null
check "the crash-looped stack left no process and no segment" $?
"$TMP/bin/pi2" down -r "$R" >/dev/null 2>&1
gone "pi2 down after the crash loop" "$R"

# A process that dies by a signal twice and then stays up is restarted, not stopped:
# the third restart is the real program again.
new_run R
cp "$BIN/cachemgr" "$TMP/bin/cachemgr.new" && mv -f "$TMP/bin/cachemgr.new" "$TMP/bin/cachemgr"
"$TMP/bin/pi2" up -m "$MODEL" -c configs/default.conf -r "$R" --timeout 60 >"$TMP/up.log" 2>&1
check "a second stack on the copied programs comes up" $?
RD=$("$PI2" rundir -r "$R")
for k in 1 2; do
    victim=$(cat "$RD/cachemgr.pid")
    kill -9 "$victim"
    restarted "$RD" cachemgr "$victim"; check "kill $k of cachemgr: the supervisor restarts it" $?
done
sleep 0.5
[ ! -f "$RD/stopped" ] && [ -n "$(cat "$RD/supervisor.pid" 2>/dev/null)" ]
check "two deaths by SIGKILL do not stop the stack" $?
