# shellcheck shell=bash
# Sourced by the stack tests (tests/test_stack*.sh, tests/test_bamboo.sh) from
# the repository root: run bookkeeping, checks, and the teardown that leaves no
# process, segment or run directory behind. The caller sets RUN_BASE (a prefix
# unique to it). Sets BIN ($BUILD/bin, absolute), PI2 and REF; defines check
# and skip (tests/sh/checks.sh), require_programs, emulated, new_run, no_leftovers, dump_logs, restarted, up,
# and the configs below.
BUILD=${BUILD:-build}
BIN=$(cd "$BUILD/bin" 2>/dev/null && pwd) || BIN=$PWD/$BUILD/bin
PI2=$BIN/pi2
# shellcheck disable=SC2034 # used by the sourcing tests
REF=$BIN/pi2-ref
TMP=$(mktemp -d)
RUNS=()
finished=0
# shellcheck source=tests/sh/checks.sh
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"

require_programs() { # require_programs NAME...: each is built in $BIN, else the suite stops
    local p
    for p in "$@"; do
        if [ ! -x "$BIN/$p" ]; then
            check "$BIN/$p exists (build first)" 1
            exit 1
        fi
    done
}

# Whether the build's programs run under an emulator (another architecture's build, started through a
# binfmt_misc rule for qemu-user: make test-arm64): a process's memory then holds the emulator's too, and its
# speed is not the program's.
emulated() {
    local machine
    machine=$(od -An -tx2 -j18 -N2 "$BIN/cachemgr" 2>/dev/null | tr -d ' ') # the ELF header's e_machine
    case "$(uname -m):$machine" in x86_64:003e | aarch64:00b7) return 1 ;; *) return 0 ;; esac
}

new_run() { # new_run VAR: a run id unique to this test process
    local id="$RUN_BASE-${#RUNS[@]}"
    RUNS+=("$id")
    printf -v "$1" '%s' "$id"
}

run_procs() { pgrep -f -- "(-r|__supervise) $1( |\$)" 2>/dev/null; }

# no_leftovers RUN: no process, no segment, no run directory
no_leftovers() {
    local rd
    rd=$("$PI2" rundir -r "$1")
    [ -z "$(run_procs "$1")" ] && ! compgen -G "/dev/shm/pi2-$1-*" >/dev/null && [ ! -e "$rd" ]
}

# dump_logs RUN: what the processes said, for a failing check
dump_logs() {
    local rd f
    rd=$("$PI2" rundir -r "$1")
    for f in "$rd"/logs/*.log; do
        [ -f "$f" ] || continue
        echo "---- $f (last 15 lines)"
        tail -n 15 "$f"
    done
}

# restarted RD PROC OLD_PID: within 5 s the supervisor's pid file for PROC in
# run directory RD names a live process other than OLD_PID
restarted() {
    local now
    for _ in $(seq 50); do
        now=$(cat "$1/$2.pid" 2>/dev/null)
        if [ -n "$now" ] && [ "$now" != "$3" ] && kill -0 "$now" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    return 1
}

finish() {
    ((finished)) && return
    finished=1
    local r ok=0
    for r in "${RUNS[@]}"; do "$PI2" down -r "$r" >/dev/null 2>&1 || ok=1; done
    check "pi2 down of every run succeeds" $ok
    ok=0
    for r in "${RUNS[@]}"; do
        if ! no_leftovers "$r"; then
            ok=1
            echo "leftovers of run $r: processes [$(run_procs "$r" | tr '\n' ' ')] segments [$(echo /dev/shm/pi2-"$r"-*)]"
        fi
    done
    check "after the suite: no process, no segment, no run directory" $ok
    rm -rf "$TMP"
    echo "$pass passed, $fail failed, $skipped skipped"
}
trap 'finish; exit 1' INT TERM
trap 'finish' EXIT

# Stack configs: two cpu-workers one per core ($TMP/two.conf), one with 2 threads ($TMP/one.conf).
cat >"$TMP/two.conf" <<'EOF'
# two cpu-workers, one per core
cachemgr cpus=0
io-worker cpus=0
coordinator cpus=0
npu-worker cpus=0-1 threads=2
cpu-worker cpus=0 threads=1
cpu-worker cpus=1 threads=1
EOF
cat >"$TMP/one.conf" <<'EOF'
cachemgr cpus=0
io-worker cpus=0
coordinator cpus=0
npu-worker cpus=0-1 threads=2
cpu-worker cpus=0-1 threads=2
EOF

up() { # up RUN CONF MODEL [extra pi2 up args]: returns pi2 up's status
    local run=$1 conf=$2 model=$3
    shift 3
    "$PI2" up -m "$model" -c "$conf" -r "$run" --ctx 512 --timeout 60 "$@" >"$TMP/up.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || { echo "pi2 up -r $run ($model, $conf) failed:"; tail -n 30 "$TMP/up.log"; }
    return $rc
}
