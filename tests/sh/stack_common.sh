# Sourced by the stack tests (tests/test_stack*.sh): run bookkeeping, checks,
# and the teardown that leaves no process, segment or run directory behind.
# The caller sets PI2 (the pi2 script) and RUN_BASE (a prefix unique to it).
# Defines check, new_run, no_leftovers, dump_logs, up, and the configs below.
TMP=$(mktemp -d)
RUNS=()
pass=0 fail=0
finished=0

check() { # check NAME STATUS
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; fi
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
    echo "$pass passed, $fail failed"
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
