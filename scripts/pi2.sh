#!/usr/bin/env bash
# pi2: the supervisor of the pi2 stack (README.md, "The supervisor `pi2`").
#   pi2 up -m MODEL [-c STACK.conf] [-r RUN] [--ctx N] [--no-npu] [--ffn MODE] [--predictor FILE] [--timeout S]
#          [--small-pages] [--mem-budget SIZE | --plan DIR]
#   pi2 down [-r RUN]
#   pi2 status [-r RUN]
#   pi2 restart PROC [-r RUN]
#   pi2 logs PROC [-f] [-r RUN]
#   pi2 profile PROC [SECONDS] [-r RUN]
#   pi2 rundir [-r RUN]
#   pi2 plan -m MODEL (--mem-budget SIZE | --target-speed X) -o DIR [...]   |   pi2 plan show PLAN
#   pi2 run [-r RUN] -p PROMPT [-n N] [--temp T --top-k K --top-p P --seed S --ignore-eos] [--dense | --ffn MODE] [--wait S]
# RUN defaults to $PI2_RUN, else "default". The programs of the stack are found
# next to this script (build/bin). `pi2 up` passes its environment on to every
# process (e.g. PI2_LOG, PI2_TASK_DELAY_US).
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
BIN_DIR=$(dirname "$SELF")
STACK_PROGRAMS=(cachemgr io-worker coordinator npu-worker cpu-worker pi2-ctl pi2-client)
STOP_GRACE_S=${PI2_STOP_GRACE_S:-5}    # SIGTERM to SIGKILL
MAX_CPU_WORKERS=16                     # STACK_MAX_CPU_WORKERS in lib/stack/stack.h (tests/test_shared_constants.sh)
LONG_LIVED_MS=5000                     # a process that ran this long before dying is not crash-looping
EARLY_DEATH_MS=60000                   # a death this soon after the start counts towards a crash loop ...
CRASH_LOOP_DEATHS=3                    # ... and this many in a row by the same signal stop the stack
MAX_BACKOFF_MS=5000
STALL_RESTART_MS=$((${PI2_STALL_S:-10} * 1000)) # a coordinator, cachemgr or io-worker not beating this long is restarted
LOG_CAP_BYTES=$((${PI2_LOG_CAP_KB:-16384} << 10)) # a log past this is moved to NAME.log.1 (one kept)
EXIT_USAGE=2                           # lib/stack/exit_codes.h: a process's exit status for bad arguments (every program)
EXIT_CONFIG=78                         # ... for a configuration it cannot run (sysexits.h EX_CONFIG)

usage() {
    cat <<'EOF'
usage: pi2 COMMAND [options]          (RUN: -r RUN, default $PI2_RUN or "default")
  up -m MODEL [-c STACK.conf] [-r RUN] [--ctx N] [--no-npu] [--ffn MODE] [--predictor FILE] [--timeout S]
     [--small-pages] [--mem-budget SIZE | --plan DIR]
                     start the stack of STACK.conf (default: configs/default.conf) on MODEL and
                     return when the weights are loaded and every process beats (timeout 120 s).
                     --ffn: auto (default: sparse on ReLU models, with the model's or FILE's
                     predictor if there is one, else gate-first), dense, gate-first, predictor
                     --small-pages: keep the segments on 4 KiB pages (faster start, slower decode)
                     --plan DIR: run within the memory budget of a pi2 plan (docs/offload.md);
                     --mem-budget SIZE (2G, 1536M, 50%): plan it first (kept for the next up)
  down [-r RUN]      stop every process, remove the segments and the run directory (idempotent)
  status [-r RUN]    per process: pid, CPU list, threads, state, heartbeat age, RSS, tokens, restarts
  restart PROC       stop PROC (e.g. cpu-worker.1); the supervisor starts it again at once
  logs PROC [-f]     the log of PROC (-f: follow it)
  profile PROC [S]   perf cpu-clock samples of PROC for S seconds (default 5), top symbols
  run -p PROMPT [-n N] [--temp T --top-k K --top-p P --seed S --ignore-eos] [--dense | --ffn MODE] [--wait S]
                     generate through the stack (pi2-client), text streamed to stdout;
                     --dense forces a dense FFN (default: the stack's --ffn mode); while another
                     generation runs it waits its turn up to --wait S (default 300)
  rundir [-r RUN]    print the run directory (sockets, pid files, logs)
  plan -m MODEL --mem-budget SIZE -o DIR [...]
                     plan MODEL for a memory budget on this machine (the planner: profiles, bundle
                     file, plan, predicted speed; -h for its options); plan show PLAN prints a plan
  -h, --help         this help
Processes: cachemgr, io-worker, coordinator, npu-worker, cpu-worker.<i>; logs in RUN_DIR/logs.
EOF
}

die() { echo "pi2: $*" >&2; exit 1; }
now_ms() { local us=${EPOCHREALTIME/./}; echo $((10#$us / 1000)); }

valid_run() { [[ $1 =~ ^[A-Za-z0-9_.-]+$ ]]; }

# The run directory, by lib/stack/rundir.c's rule: $XDG_RUNTIME_DIR/pi2-RUN when
# that is an absolute path to a directory, else /tmp/pi2-<uid>-RUN.
run_dir() {
    if [[ ${XDG_RUNTIME_DIR:-} == /* && -d ${XDG_RUNTIME_DIR} ]]; then
        echo "$XDG_RUNTIME_DIR/pi2-$1"
    else
        echo "/tmp/pi2-$(id -u)-$1"
    fi
}

need_programs() {
    local p
    for p in "${STACK_PROGRAMS[@]}"; do
        [ -x "$BIN_DIR/$p" ] || die "$BIN_DIR/$p is missing (build with make)"
    done
}

# ---------------------------------------------------------------------------
# Stack config: one process per line ("cpu-worker cpus=1 threads=1"), or a
# stack setting ("ctx=512"); '#' starts a comment. Fills the P_* arrays.
# ---------------------------------------------------------------------------
P_NAME=() P_KIND=() P_CPUS=() P_THREADS=()
CFG_CTX="" CFG_MAX_PREFILL="" CFG_PREFILL_STALL="" CFG_SPLIT="" CFG_BUNDLE_CHECKSUMS="" CFG_REALTIME_IO="" CFG_FFN="" CFG_PREDICTOR="" CFG_SMALL_PAGES="" CFG_PLAN=""
MEM_NEED="" MEM_LIMIT="" MEM_SOURCE=""  # from cachemgr --check: the segments' bytes, the memory limit

allowed_cpus() { sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status; }

# cpu_in_list CPU LIST: is CPU in the list "0-1,3"?
cpu_in_list() {
    local cpu=$1 part lo hi
    IFS=, read -ra parts <<<"$2"
    for part in "${parts[@]}"; do
        lo=${part%-*}; hi=${part#*-}
        if ((cpu >= lo && cpu <= hi)); then return 0; fi
    done
    return 1
}

# check_cpu_list LIST WHERE: a list like "0", "0-1", "0,2-3" of CPUs we may use.
check_cpu_list() {
    local list=$1 where=$2 allowed part lo hi c
    [[ $list =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] ||
        die "$where: cpus='$list' is not a CPU list like 0 or 0-1 or 0,2-3"
    allowed=$(allowed_cpus)
    IFS=, read -ra parts <<<"$list"
    for part in "${parts[@]}"; do
        lo=$((10#${part%-*})); hi=$((10#${part#*-}))
        ((lo <= hi)) || die "$where: cpus='$list': range $part runs backwards"
        for ((c = lo; c <= hi; c++)); do
            cpu_in_list "$c" "$allowed" || die "$where: cpus='$list': CPU $c is not available (allowed: $allowed)"
        done
    done
}

check_count() { # check_count VALUE WHAT WHERE MIN MAX
    [[ $1 =~ ^[0-9]+$ ]] && (( 10#$1 >= $4 && 10#$1 <= $5 )) ||
        die "$3: $2='$1' is not an integer in [$4, $5]"
}

parse_config() {
    local file=$1 lineno=0 line kind w cpus threads n_cpu=0 i
    local -A seen=()
    [ -r "$file" ] || die "stack config $file: cannot read it"
    while IFS= read -r line || [ -n "$line" ]; do
        lineno=$((lineno + 1))
        line=${line%%#*}
        read -ra words <<<"$line"
        [ ${#words[@]} -eq 0 ] && continue
        local where="$file:$lineno"
        kind=${words[0]}
        case $kind in
        ctx=*)
            [ ${#words[@]} -eq 1 ] || die "$where: a stack setting stands alone on its line"
            CFG_CTX=${kind#ctx=}; check_count "$CFG_CTX" ctx "$where" 1 1048576; continue ;;
        max-prefill=*)
            [ ${#words[@]} -eq 1 ] || die "$where: a stack setting stands alone on its line"
            CFG_MAX_PREFILL=${kind#max-prefill=}; check_count "$CFG_MAX_PREFILL" max-prefill "$where" 1 65536
            continue ;;
        prefill-stall=*)
            [ ${#words[@]} -eq 1 ] || die "$where: a stack setting stands alone on its line"
            CFG_PREFILL_STALL=${kind#prefill-stall=}; check_count "$CFG_PREFILL_STALL" prefill-stall "$where" 1 3600000
            continue ;;
        split=*)
            [ ${#words[@]} -eq 1 ] || die "$where: a stack setting stands alone on its line"
            CFG_SPLIT=${kind#split=}
            [[ $CFG_SPLIT =~ ^(auto|even|[0-9.]+(,[0-9.]+)*)$ ]] ||
                die "$where: split='$CFG_SPLIT' is not auto, even or weights W0,W1,..."
            continue ;;
        bundle-checksums=*)
            [ ${#words[@]} -eq 1 ] || die "$where: a stack setting stands alone on its line"
            CFG_BUNDLE_CHECKSUMS=${kind#bundle-checksums=}
            case $CFG_BUNDLE_CHECKSUMS in on | off) ;; *) die "$where: bundle-checksums='$CFG_BUNDLE_CHECKSUMS' is not on or off" ;; esac
            continue ;;
        realtime-io=*)
            [ ${#words[@]} -eq 1 ] || die "$where: a stack setting stands alone on its line"
            CFG_REALTIME_IO=${kind#realtime-io=}
            case $CFG_REALTIME_IO in on | off) ;; *) die "$where: realtime-io='$CFG_REALTIME_IO' is not on or off" ;; esac
            continue ;;
        cachemgr | io-worker | coordinator | npu-worker | cpu-worker) ;;
        *) die "$where: unknown process '$kind' (expected cachemgr, io-worker, coordinator, npu-worker, cpu-worker, ctx=N, max-prefill=N, prefill-stall=MS, split=auto|even|W0,W1,..., bundle-checksums=on|off or realtime-io=on|off)" ;;
        esac
        if [ "$kind" != cpu-worker ] && [ -n "${seen[$kind]:-}" ]; then
            die "$where: a second $kind (the first is on line ${seen[$kind]})"
        fi
        seen[$kind]=$lineno
        cpus="" threads=1
        for w in "${words[@]:1}"; do
            case $w in
            cpus=*) cpus=${w#cpus=}; check_cpu_list "$cpus" "$where" ;;
            threads=*)
                case $kind in npu-worker | cpu-worker) ;; *) die "$where: $kind takes no threads= setting" ;; esac
                threads=${w#threads=}; check_count "$threads" threads "$where" 1 256 ;;
            *) die "$where: unknown setting '$w' for $kind (expected cpus=LIST or threads=N)" ;;
            esac
        done
        if [ "$kind" = cpu-worker ]; then
            P_NAME+=("cpu-worker.$n_cpu"); n_cpu=$((n_cpu + 1))
        else
            P_NAME+=("$kind")
        fi
        P_KIND+=("$kind") P_CPUS+=("$cpus") P_THREADS+=("$threads")
    done <"$file"
    for kind in cachemgr io-worker coordinator; do
        [ -n "${seen[$kind]:-}" ] || die "$file: no $kind line (a stack needs cachemgr, io-worker, coordinator and cpu-workers)"
    done
    ((n_cpu >= 1)) || die "$file: no cpu-worker line (a stack needs at least one)"
    ((n_cpu <= MAX_CPU_WORKERS)) || die "$file: $n_cpu cpu-workers, at most $MAX_CPU_WORKERS"
    if [[ $CFG_SPLIT == *[0-9]* ]]; then
        local weights
        IFS=, read -ra weights <<<"$CFG_SPLIT"
        [ ${#weights[@]} -eq "$n_cpu" ] ||
            die "$file: split=$CFG_SPLIT gives ${#weights[@]} weights for $n_cpu cpu-workers"
    fi
    # startup order: cachemgr, io-worker, coordinator, npu-worker, cpu-workers
    local order=() k
    for k in cachemgr io-worker coordinator npu-worker cpu-worker; do
        for i in "${!P_KIND[@]}"; do [ "${P_KIND[$i]}" = "$k" ] && order+=("$i"); done
    done
    local n=() kd=() c=() t=()
    for i in "${order[@]}"; do n+=("${P_NAME[$i]}") kd+=("${P_KIND[$i]}") c+=("${P_CPUS[$i]}") t+=("${P_THREADS[$i]}"); done
    P_NAME=("${n[@]}") P_KIND=("${kd[@]}") P_CPUS=("${c[@]}") P_THREADS=("${t[@]}")
}

drop_npu_worker() {
    local i n=() kd=() c=() t=()
    for i in "${!P_KIND[@]}"; do
        [ "${P_KIND[$i]}" = npu-worker ] && continue
        n+=("${P_NAME[$i]}") kd+=("${P_KIND[$i]}") c+=("${P_CPUS[$i]}") t+=("${P_THREADS[$i]}")
    done
    P_NAME=("${n[@]}") P_KIND=("${kd[@]}") P_CPUS=("${c[@]}") P_THREADS=("${t[@]}")
}

n_cpu_workers() { local k count=0; for k in "${P_KIND[@]}"; do [ "$k" = cpu-worker ] && count=$((count + 1)); done; echo $count; }
has_npu_worker() { local k; for k in "${P_KIND[@]}"; do [ "$k" = npu-worker ] && return 0; done; return 1; }

# ---------------------------------------------------------------------------
# Run state. stack.env (written by `pi2 up`) holds the model and the process
# table; supervisor.pid and <proc>.pid the pids; supervisor.state the
# supervisor's view (name pid restarts) for `pi2 status`; stopped the reason
# the supervisor stopped the stack by itself.
# ---------------------------------------------------------------------------
RUN=${PI2_RUN:-default}
RD=""

set_run() {
    RUN=$1
    valid_run "$RUN" || die "run id '$RUN': must be [A-Za-z0-9_.-]+"
    RD=$(run_dir "$RUN")
}

write_stack_env() {
    {
        printf 'MODEL=%q\nCFG_CTX=%q\nCFG_MAX_PREFILL=%q\nCFG_PREFILL_STALL=%q\nCFG_SPLIT=%q\nCFG_BUNDLE_CHECKSUMS=%q\nCFG_REALTIME_IO=%q\nCFG_FFN=%q\nCFG_PREDICTOR=%q\nCFG_SMALL_PAGES=%q\nCFG_PLAN=%q\n' \
            "$MODEL" "$CFG_CTX" "$CFG_MAX_PREFILL" "$CFG_PREFILL_STALL" "$CFG_SPLIT" "$CFG_BUNDLE_CHECKSUMS" "$CFG_REALTIME_IO" "$CFG_FFN" "$CFG_PREDICTOR" "$CFG_SMALL_PAGES" "$CFG_PLAN"
        printf 'MEM_NEED=%q\nMEM_LIMIT=%q\nMEM_SOURCE=%q\n' "$MEM_NEED" "$MEM_LIMIT" "$MEM_SOURCE"
        declare -p P_NAME P_KIND P_CPUS P_THREADS | sed 's/^declare -a /declare -ga /'
    } >"$RD/stack.env"
}

load_stack_env() {
    [ -f "$RD/stack.env" ] || die "run '$RUN' is not up (no $RD/stack.env)"
    # shellcheck source=/dev/null
    source "$RD/stack.env"
}

# A zombie is not alive: the supervisor's parent (init, once `pi2 up` exits)
# may take a while to reap it.
pid_alive() {
    [ -n "$1" ] && [ "$1" -gt 0 ] && kill -0 "$1" 2>/dev/null || return 1
    local stat
    { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

read_pid() { local p=""; [ -f "$1" ] && read -r p <"$1" 2>/dev/null; [[ $p =~ ^[0-9]+$ ]] && echo "$p" || echo 0; }

supervisor_pid() {
    local p
    p=$(read_pid "$RD/supervisor.pid")
    # a recycled pid is not our supervisor: check its command line
    if pid_alive "$p" && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "__supervise $RUN\b"; then
        echo "$p"
    else
        echo 0
    fi
}

# Whether process PID runs program PATH: natively, or through a binfmt_misc interpreter (qemu-user
# running another architecture's build), whose /proc/PID/exe is the interpreter and PATH its first argument.
runs_program() {
    local exe argv=()
    exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
    [ "$exe" = "$2" ] && return 0
    mapfile -d '' -t argv <"/proc/$1/cmdline" 2>/dev/null
    [ "${argv[1]:-}" = "$2" ]
}

# The pid in RD/<name>.pid if that process is still the program we started.
proc_pid() {
    local name=$1 p
    p=$(read_pid "$RD/$name.pid")
    if pid_alive "$p" && runs_program "$p" "$BIN_DIR/${name%%.*}"; then
        echo "$p"
    else
        echo 0
    fi
}

proc_index() {
    local i
    for i in "${!P_NAME[@]}"; do [ "${P_NAME[$i]}" = "$1" ] && { echo "$i"; return 0; }; done
    die "run '$RUN' has no process '$1' (it has: ${P_NAME[*]})"
}

# ---------------------------------------------------------------------------
# The supervisor: a background loop (own session) that starts the processes,
# restarts the ones that die, and tears the stack down on SIGTERM or when the
# coordinator dies.
# ---------------------------------------------------------------------------
declare -a PID=() RESTARTS=() STARTED_MS=() NEXT_START_MS=() FAST_CRASHES=()
declare -a SIG_DEATHS=() SIG_LAST=() SIG_SINCE_MS=() # early deaths in a row by one signal, which, since when
STOP_REQUESTED=0

slog() { echo "$(date '+%F %T.%3N') pi2-supervisor: $*"; }

proc_command() { # fills CMD for process i
    local i=$1
    local base=(-m "$MODEL" -r "$RUN")
    case ${P_KIND[$i]} in
    cachemgr)
        CMD=("$BIN_DIR/cachemgr" "${base[@]}" --cpu-workers "$(n_cpu_workers)")
        if [ -n "$CFG_CTX" ]; then CMD+=(-c "$CFG_CTX"); fi
        if [ -n "$CFG_MAX_PREFILL" ]; then CMD+=(--max-prefill "$CFG_MAX_PREFILL"); fi
        if [ -n "$CFG_FFN" ]; then CMD+=(--ffn "$CFG_FFN"); fi
        if [ -n "$CFG_PREDICTOR" ]; then CMD+=(--predictor "$CFG_PREDICTOR"); fi
        if [ -n "$CFG_SMALL_PAGES" ]; then CMD+=(--small-pages); fi
        if [ -n "$CFG_PLAN" ]; then CMD+=(--plan "$CFG_PLAN"); fi
        ;;
    io-worker)
        CMD=("$BIN_DIR/io-worker" "${base[@]}")
        if [ "$CFG_BUNDLE_CHECKSUMS" = off ]; then CMD+=(--no-verify); fi
        if [ "$CFG_REALTIME_IO" = off ]; then CMD+=(--no-realtime); fi
        ;;
    coordinator)
        CMD=("$BIN_DIR/coordinator" "${base[@]}")
        has_npu_worker || CMD+=(--no-npu)
        if [ -n "$CFG_PREFILL_STALL" ]; then CMD+=(--prefill-stall "$CFG_PREFILL_STALL"); fi
        if [ -n "$CFG_SPLIT" ]; then CMD+=(--split "$CFG_SPLIT"); fi
        ;;
    npu-worker) CMD=("$BIN_DIR/npu-worker" "${base[@]}" -t "${P_THREADS[$i]}") ;;
    cpu-worker)
        CMD=("$BIN_DIR/cpu-worker" "${base[@]}" -i "${P_NAME[$i]#cpu-worker.}" -t "${P_THREADS[$i]}")
        if [ "$CFG_REALTIME_IO" = off ]; then CMD+=(--no-realtime); fi
        ;;
    esac
}

start_proc() {
    local i=$1
    local name=${P_NAME[$i]}
    local log="$RD/logs/$name.log"
    proc_command "$i"
    if [ -n "${P_CPUS[$i]}" ]; then CMD=(taskset -c "${P_CPUS[$i]}" "${CMD[@]}"); fi
    echo "==== $(date '+%F %T') pi2: ${CMD[*]}" >>"$log"
    # a simple command in the background is exec'ed in the forked child, and
    # taskset execs the program: $! is the program's pid
    if [ -n "$TICK_FD" ]; then
        "${CMD[@]}" </dev/null >>"$log" 2>&1 {TICK_FD}<&- &
    else
        "${CMD[@]}" </dev/null >>"$log" 2>&1 &
    fi
    PID[$i]=$!
    STARTED_MS[$i]=$(now_ms)
    echo "${PID[$i]}" >"$RD/$name.pid"
    slog "started $name (pid ${PID[$i]}, cpus ${P_CPUS[$i]:-any}, threads ${P_THREADS[$i]})"
}

write_state() {
    local i tmp="$RD/supervisor.state.tmp"
    for i in "${!P_NAME[@]}"; do echo "${P_NAME[$i]} ${PID[$i]} ${RESTARTS[$i]}"; done >"$tmp"
    mv -f "$tmp" "$RD/supervisor.state"
}

# reap I: collects the exit status of a dead child into REAPED (not in a
# subshell: only this shell can wait for its children); a status that
# await_exit already collected is taken from EXITED
reap() {
    local st=0 p=${PID[$1]}
    if [ -n "${EXITED[$p]:-}" ]; then
        st=${EXITED[$p]}
        unset "EXITED[$p]"
    else
        wait "$p" 2>/dev/null || st=$?
    fi
    REAPED_STATUS=$st
    if ((st > 128)); then REAPED="killed by signal $((st - 128))"; else REAPED="exited with status $st"; fi
}

# Sends SIGTERM to every live process, SIGKILL to those left after the grace time.
stop_all() {
    local i deadline
    for i in "${!P_NAME[@]}"; do pid_alive "${PID[$i]}" && kill -TERM "${PID[$i]}" 2>/dev/null; done
    deadline=$(($(now_ms) + STOP_GRACE_S * 1000))
    while (($(now_ms) < deadline)); do
        local alive=0
        for i in "${!P_NAME[@]}"; do pid_alive "${PID[$i]}" && alive=1; done
        ((alive)) || break
        tick
    done
    for i in "${!P_NAME[@]}"; do
        if pid_alive "${PID[$i]}"; then
            slog "${P_NAME[$i]} (pid ${PID[$i]}) ignored SIGTERM for ${STOP_GRACE_S} s: SIGKILL"
            kill -KILL "${PID[$i]}" 2>/dev/null || true
        fi
    done
    for i in "${!P_NAME[@]}"; do
        if [ "${PID[$i]}" -gt 0 ]; then
            reap "$i"
            slog "${P_NAME[$i]} (pid ${PID[$i]}) $REAPED"
            PID[$i]=0
        fi
        rm -f "$RD/${P_NAME[$i]}.pid"
    done
}

# Removes the segments and sockets but keeps the logs for `pi2 logs` until
# `pi2 down` (pi2-ctl cleanup removes both). Every process is gone by now, so
# unlinking the files under /dev/shm is all shm_unlink_run would do.
release_resources() {
    rm -f -- /dev/shm/pi2-"$RUN"-* "$RD"/*.sock
}

# teardown REASON [brief]: brief when REASON says all there is (the logs of a
# process killed from outside say nothing of why)
teardown() {
    slog "stopping the stack: $1"
    echo "$1" >"$RD/stopped"
    if [ "${2:-}" = brief ]; then touch "$RD/stopped.brief"; fi
    stop_all
    release_resources
    write_state
    rm -f "$RD/supervisor.pid"
    if pid_alive "$WAKE_PID"; then kill "$WAKE_PID" 2>/dev/null || true; fi
    slog "stack stopped"
    exit 0
}

# A sleep without a fork: read with a timeout from a pipe nobody writes to
# (opened on first use; the stack's processes do not inherit it).
TICK_FD=""
tick() {
    [ -n "$TICK_FD" ] || exec {TICK_FD}<> <(:)
    read -r -t "${1:-0.1}" -u "$TICK_FD" _ || true
}

# Sleeps until something needs the supervisor: a process exits (wait -n,
# which keeps its status in EXITED), a signal arrives, a delayed restart is
# due, or the wake-up timer ends. It used to poll every 100 ms, and each round
# of bash took ~2 ms of CPU on the cores the workers run on: a worker
# preempted mid-layer held the other at the next barrier (~0.7 ms per token
# of a 7B decode). bash forgets a job that died before wait -n is called (a
# non-interactive shell drops a job from its table once it has reported it),
# so it looks first; a death between that look and the wait is seen when the
# timer ends, WAKE_S later at most, never missed.
WAKE_S=5
WAKE_PID=0
declare -A EXITED=()
await_exit() {
    local i live=() died="" st=0
    for i in "${!P_NAME[@]}"; do
        if [ "${PID[$i]}" -eq 0 ]; then
            tick # a restart is waiting for its time
            return
        fi
        pid_alive "${PID[$i]}" || return 0
        live+=("${PID[$i]}")
    done
    if ! pid_alive "$WAKE_PID"; then
        if [ -n "$TICK_FD" ]; then sleep "$WAKE_S" {TICK_FD}<&- & else sleep "$WAKE_S" & fi
        WAKE_PID=$!
    fi
    wait -n -p died "${live[@]}" "$WAKE_PID" 2>/dev/null || st=$?
    # a signal leaves died unset (the trap has set STOP_REQUESTED)
    if [ -n "${died:-}" ] && [ "$died" != "$WAKE_PID" ]; then EXITED[$died]=$st; fi
}

# cap_logs: every log in the run past LOG_CAP_BYTES is copied to NAME.log.1 and
# emptied (the process keeps its O_APPEND descriptor, so it writes on at the
# start; lines written between the copy and the emptying are lost), so a
# long-lived or flooded stack keeps at most two caps per log. Checked each time
# the supervisor wakes (every WAKE_S at most).
cap_logs() {
    local f
    while IFS= read -r f; do
        cp -f -- "$f" "$f.1" && : >"$f"
        slog "$(basename "$f") passed $((LOG_CAP_BYTES >> 10)) KiB: moved to $(basename "$f").1"
    done < <(find "$RD/logs" -maxdepth 1 -name '*.log' -size +"$((LOG_CAP_BYTES >> 10))"k 2>/dev/null)
}

# heal_stalls: a coordinator, cachemgr or io-worker that pi2-ctl shows
# stalled (alive, ready or busy, its heartbeat older than STALL_RESTART_MS)
# is killed and started again, with why in the log. These processes never
# compute for long, so a silent one is stuck; compute workers are judged by
# their progress instead (the coordinator re-sends their work). One pi2-ctl
# per wake of the supervisor (every WAKE_S at most).
heal_stalls() {
    local name pid state age i
    while read -r name pid state age _; do
        [ "$state" = stalled ] && [[ $age =~ ^[0-9]+$ ]] && ((age >= STALL_RESTART_MS)) || continue
        for i in "${!P_NAME[@]}"; do
            [ "${P_NAME[$i]}" = "$name" ] && [ "${PID[$i]}" = "$pid" ] || continue
            case ${P_KIND[$i]} in coordinator | cachemgr | io-worker) ;; *) continue ;; esac
            slog "$name (pid $pid) has not beaten for $((age / 1000)) s: killing it to start it again"
            echo "stalled: no heartbeat for $((age / 1000)) s" >"$RD/restart.$name"
            kill -KILL "$pid" 2>/dev/null || true
        done
    done < <("$BIN_DIR/pi2-ctl" -r "$RUN" status 2>/dev/null)
}

gib() { awk -v b="$1" 'BEGIN { if (b >= 1073741824) printf "%.2f GiB", b / 1073741824; else printf "%.1f MiB", b / 1048576 }'; }

# crash_loop I STATUS NOW: counts an early death by a signal; after
# CRASH_LOOP_DEATHS in a row by the same one, the stack stops with why. A
# process the kernel kills for memory comes back to the same fate: restarting
# it forever only hides the cause (and a restarted cachemgr reloads the model).
crash_loop() {
    local i=$1 st=$2 now=$3 sig
    if ((st <= 128 || now - STARTED_MS[i] >= EARLY_DEATH_MS)); then
        SIG_DEATHS[$i]=0 SIG_LAST[$i]=""
        return
    fi
    if [ "${SIG_LAST[$i]}" != "$st" ]; then
        SIG_DEATHS[$i]=0 SIG_LAST[$i]=$st SIG_SINCE_MS[$i]=${STARTED_MS[$i]}
    fi
    SIG_DEATHS[$i]=$((SIG_DEATHS[i] + 1))
    ((SIG_DEATHS[i] >= CRASH_LOOP_DEATHS)) || return 0
    sig=SIG$(kill -l $((st - 128)) 2>/dev/null || echo $((st - 128)))
    local why="${P_NAME[$i]} was killed by $sig ${SIG_DEATHS[$i]} times within $(((now - SIG_SINCE_MS[i] + 999) / 1000)) s"
    if [ "$sig" = SIGKILL ]; then
        why+=": out of memory?"
        [ -z "$MEM_NEED" ] || why+=" the stack needs $(gib "$MEM_NEED") of shared memory, this process may use $(gib "$MEM_LIMIT") ($MEM_SOURCE)"
    fi
    teardown "$why" brief
}

supervise() {
    set_run "$1"
    load_stack_env
    echo $$ >"$RD/supervisor.pid"
    trap 'STOP_REQUESTED=1' TERM INT HUP
    local i now desc
    slog "supervising run $RUN (model $MODEL): ${P_NAME[*]}"
    for i in "${!P_NAME[@]}"; do
        RESTARTS[$i]=0 FAST_CRASHES[$i]=0 NEXT_START_MS[$i]=0 PID[$i]=0 SIG_DEATHS[$i]=0 SIG_LAST[$i]=""
        start_proc "$i"
    done
    write_state
    while ((!STOP_REQUESTED)); do
        await_exit
        cap_logs
        heal_stalls
        now=$(now_ms)
        local changed=0
        for i in "${!P_NAME[@]}"; do
            local name=${P_NAME[$i]}
            if [ "${PID[$i]}" -gt 0 ] && ! pid_alive "${PID[$i]}"; then
                reap "$i"
                desc=$REAPED
                PID[$i]=0 changed=1
                if [ -f "$RD/restart.$name" ]; then
                    local why
                    why=$(head -c 200 "$RD/restart.$name" 2>/dev/null)
                    rm -f "$RD/restart.$name"
                    slog "$name $desc (${why:-pi2 restart}): starting it again"
                    NEXT_START_MS[$i]=$now
                elif [ "${P_KIND[$i]}" = coordinator ]; then
                    teardown "the coordinator $desc"
                elif ((REAPED_STATUS == EXIT_USAGE || REAPED_STATUS == EXIT_CONFIG)); then
                    # a restart would meet the same arguments: give up at once
                    teardown "$name refused its configuration ($desc): $(tail -n 1 "$RD/logs/$name.log" 2>/dev/null)"
                else
                    crash_loop "$i" "$REAPED_STATUS" "$now"
                    local delay=0
                    if ((now - STARTED_MS[i] < LONG_LIVED_MS)); then
                        FAST_CRASHES[$i]=$((FAST_CRASHES[i] + 1))
                        delay=$((100 << (FAST_CRASHES[i] - 1)))
                        ((FAST_CRASHES[i] < 7 && delay < MAX_BACKOFF_MS)) || delay=$MAX_BACKOFF_MS
                    else
                        FAST_CRASHES[$i]=0
                    fi
                    NEXT_START_MS[$i]=$((now + delay))
                    slog "$name $desc unexpectedly: restarting it in $delay ms (${FAST_CRASHES[$i]} quick crashes in a row)"
                fi
                RESTARTS[$i]=$((RESTARTS[i] + 1))
            fi
            if [ "${PID[$i]}" -eq 0 ] && ((now >= NEXT_START_MS[i])); then
                start_proc "$i"
                changed=1
            fi
        done
        if ((changed)); then write_state; fi
    done
    teardown "stopped by pi2 down"
}

# ---------------------------------------------------------------------------
# Commands.
# ---------------------------------------------------------------------------

# Stops what a supervisor that died left behind (by pid file, checked against
# the program: SIGTERM, then SIGKILL after the grace time), then removes the
# segments, sockets, logs and the run directory.
remove_run() {
    local f name p pids=() deadline
    if [ -d "$RD" ]; then
        for f in "$RD"/*.pid; do
            [ -e "$f" ] || continue
            name=$(basename "$f" .pid)
            [ "$name" = supervisor ] && continue
            p=$(proc_pid "$name")
            if [ "$p" -gt 0 ]; then
                echo "pi2: stopping $name (pid $p), left behind by a supervisor that died" >&2
                kill -TERM "$p" 2>/dev/null || true
                pids+=("$p")
            fi
        done
    fi
    deadline=$(($(now_ms) + STOP_GRACE_S * 1000))
    for p in "${pids[@]}"; do wait_or_kill "$p" "$deadline" || true; done
    "$BIN_DIR/pi2-ctl" -r "$RUN" cleanup
}

# wait_or_kill PID DEADLINE_MS: waits for PID to exit until the deadline, then
# sends it SIGKILL and returns 1.
wait_or_kill() {
    while pid_alive "$1" && (($(now_ms) < $2)); do tick; done
    pid_alive "$1" || return 0
    kill -KILL "$1" 2>/dev/null || true
    return 1
}

# parse_run_only CMD ARGS...: the arguments of a command that takes only -r RUN.
parse_run_only() {
    local cmd=$1
    shift
    while [ $# -gt 0 ]; do
        case $1 in
        -r) set_run "$2"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) die "$cmd: unknown argument '$1'" ;;
        esac
    done
    [ -n "$RD" ] || set_run "$RUN"
}

cmd_down() {
    parse_run_only down "$@"
    local sp
    sp=$(supervisor_pid)
    if [ "$sp" -gt 0 ]; then
        kill -TERM "$sp" 2>/dev/null || true
        wait_or_kill "$sp" $(($(now_ms) + (STOP_GRACE_S + 10) * 1000)) ||
            echo "pi2: the supervisor (pid $sp) did not stop: SIGKILL" >&2
    fi
    remove_run
}

BEAT_FRESH_MS=1000   # processes beat every <= 200 ms

# Is process NAME, as we started it, in CTL_STATUS (pi2-ctl status) ready or
# busy with a fresh heartbeat? Rows: name pid state beat_ms ...
is_beating() {
    local p
    p=$(proc_pid "$1")
    [ "$p" -gt 0 ] && awk -v n="$1" -v p="$p" -v fresh="$BEAT_FRESH_MS" '
        $1 == n && $2 == p && ($3 == "ready" || $3 == "busy") && $4 <= fresh { ok = 1 }
        END { exit !ok }' <<<"$CTL_STATUS"
}

# Weights loaded and every configured process beating (sets CTL_STATUS).
all_beating() {
    local name
    CTL_STATUS=$("$BIN_DIR/pi2-ctl" -r "$RUN" status 2>/dev/null) || return 1
    grep -Eq '^weights_ready [1-9]' <<<"$CTL_STATUS" || return 1
    for name in "${P_NAME[@]}"; do is_beating "$name" || return 1; done
}

# The last lines of the logs of the processes that are not beating.
print_failing_logs() {
    local i name shown=0 lines=15
    for i in "${!P_NAME[@]}"; do
        name=${P_NAME[$i]}
        if ! is_beating "$name"; then
            echo "---- $name: last lines of $RD/logs/$name.log" >&2
            tail -n "$lines" "$RD/logs/$name.log" >&2 2>/dev/null || true
            shown=1
        fi
    done
    ((shown)) && lines=5
    echo "---- supervisor: last lines of $RD/logs/supervisor.log" >&2
    tail -n "$lines" "$RD/logs/supervisor.log" >&2 2>/dev/null || true
}

# The model, its tokenizer and FFN mode, and the memory its segments need,
# checked once (cachemgr --check) before any process starts: one line that
# names what is wrong, instead of every process failing on its own.
preflight() {
    local i out err rc=0 msg
    for i in "${!P_KIND[@]}"; do [ "${P_KIND[$i]}" = cachemgr ] && proc_command "$i"; done
    err=$(mktemp)
    out=$(PI2_LOG=error "${CMD[@]}" --check 2>"$err") || rc=$?
    msg=$(sed -n 's/^cachemgr\[[0-9]*\] ERROR *//p' "$err" | head -n 1)
    [ -n "$msg" ] || msg="cachemgr --check failed (exit $rc): $(tail -n 1 "$err")"
    rm -f "$err"
    ((rc == 0)) || die "up: $msg"
    read -r MEM_NEED MEM_LIMIT MEM_SOURCE <<<"$out"
}

# --mem-budget without --plan: the plan for this model, budget, context and
# stack config, made once by the planner (its progress on stderr) and kept
# in the cache directory for the next `pi2 up` with the same request.
plan_for_budget() {
    local budget=$1 conf=$2 ctx=$3 key dir
    key=$(printf '%s|%s|%s|%s|%s|%s|%s' "$MODEL" "$(stat -c %s "$MODEL")" "$budget" "$ctx" "$(cat "$conf")" \
        "$CFG_FFN" "$CFG_PREDICTOR" | sha256sum | cut -c1-16)
    dir=${XDG_CACHE_HOME:-$HOME/.cache}/pi2/plans/$(basename "$MODEL")-$budget-$key
    if [ ! -r "$dir/plan.pb" ]; then
        local args=(-m "$MODEL" --mem-budget "$budget" -c "$conf" -o "$dir")
        if [ -n "$ctx" ]; then args+=(--ctx "$ctx"); fi
        case $CFG_FFN in predictor | gate-first) args+=(--mode "$CFG_FFN") ;; esac
        if [ -n "$CFG_PREDICTOR" ]; then args+=(--predictor "$CFG_PREDICTOR"); fi
        echo "pi2: planning $(basename "$MODEL") for $budget (once; kept in $dir)" >&2
        "$BIN_DIR/planner" "${args[@]}" >&2 || die "up: --mem-budget $budget: the planner could not make a plan (above)"
    fi
    CFG_PLAN=$dir
}

cmd_up() {
    local model="" conf="" ctx="" no_npu=0 timeout_s=120 budget=""
    while [ $# -gt 0 ]; do
        case $1 in
        --plan) CFG_PLAN=$2; shift 2 ;;
        --mem-budget) budget=$2; shift 2 ;;
        -m) model=$2; shift 2 ;;
        -c) conf=$2; shift 2 ;;
        -r) set_run "$2"; shift 2 ;;
        --ctx) ctx=$2; shift 2 ;;
        --no-npu) no_npu=1; shift ;;
        --ffn) CFG_FFN=$2; shift 2 ;;
        --predictor) CFG_PREDICTOR=$2; shift 2 ;;
        --small-pages) CFG_SMALL_PAGES=1; shift ;;
        --timeout) timeout_s=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) die "up: unknown argument '$1'" ;;
        esac
    done
    [ -n "$RD" ] || set_run "$RUN"
    [ -n "$model" ] || die "up: -m MODEL is required"
    [ -r "$model" ] || die "up: model $model: cannot read it"
    MODEL=$(readlink -f "$model")
    case $CFG_FFN in "" | auto | dense | gate-first | predictor) ;; *) die "up: --ffn '$CFG_FFN': expected auto, dense, gate-first or predictor" ;; esac
    if [ -n "$CFG_PREDICTOR" ]; then
        [ -r "$CFG_PREDICTOR" ] || die "up: predictor $CFG_PREDICTOR: cannot read it"
        CFG_PREDICTOR=$(readlink -f "$CFG_PREDICTOR")
    fi
    if [ -z "$conf" ]; then
        conf=$BIN_DIR/../../configs/default.conf
        [ -r "$conf" ] || die "up: no -c STACK.conf and no $conf"
    fi
    check_count "$timeout_s" --timeout "up" 1 86400
    ((BASH_VERSINFO[0] > 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] >= 1))) ||
        die "up: the supervisor needs bash 5.1 or later (wait -n -p); this is bash $BASH_VERSION"
    need_programs
    parse_config "$conf"
    if [ -n "$ctx" ]; then check_count "$ctx" --ctx "up" 1 1048576; CFG_CTX=$ctx; fi
    if [ -n "$budget" ] && [ -n "$CFG_PLAN" ]; then die "up: --mem-budget or --plan, not both (the plan has its budget)"; fi
    if [ -n "$budget" ]; then plan_for_budget "$budget" "$conf" "$ctx"; fi
    if [ -n "$CFG_PLAN" ]; then
        [ -e "$CFG_PLAN" ] || die "up: plan $CFG_PLAN: no such file or directory"
        CFG_PLAN=$(readlink -f "$CFG_PLAN")
        if [ -z "$ctx" ]; then CFG_CTX=""; fi # the plan's (cachemgr refuses a --ctx the plan was not made for)
    fi
    if ((no_npu)); then drop_npu_worker; fi
    # token by token, the cpu-workers would need every FFN row, which a budget does not keep
    if [ -n "$CFG_PLAN" ] && ! has_npu_worker; then
        die "up: under a memory budget the prompt runs on the npu-worker (dense, the FFN read from the model file a layer at a time), and this stack has none$( ((no_npu)) && echo " (--no-npu)"): add an npu-worker line to the stack config"
    fi
    preflight

    local sp
    sp=$(supervisor_pid)
    [ "$sp" -eq 0 ] || die "run '$RUN' is already up (supervisor pid $sp): pi2 down -r $RUN first"
    if [ -d "$RD" ] || compgen -G "/dev/shm/pi2-$RUN-*" >/dev/null; then
        echo "pi2: removing what an earlier run '$RUN' left behind" >&2
        remove_run
    fi
    mkdir -m 0700 "$RD" || die "cannot create the run directory $RD"
    mkdir -m 0700 "$RD/logs"
    write_stack_env

    local t0
    t0=$(now_ms)
    # not a process group leader, so setsid execs in place: $! is the supervisor
    setsid "$SELF" __supervise "$RUN" </dev/null >>"$RD/logs/supervisor.log" 2>&1 &
    local sup=$! deadline=$((t0 + timeout_s * 1000))
    CTL_STATUS=""
    while ! all_beating; do
        if [ -f "$RD/stopped" ] || ! pid_alive "$sup"; then
            echo "pi2: the stack stopped while starting: $(cat "$RD/stopped" 2>/dev/null || echo "the supervisor exited")" >&2
            [ -f "$RD/stopped.brief" ] || print_failing_logs
            cmd_down >/dev/null
            exit 1
        fi
        if (($(now_ms) > deadline)); then
            echo "pi2: run '$RUN' not ready after $timeout_s s (weights loaded and every process beating)" >&2
            [ -n "$CTL_STATUS" ] && echo "$CTL_STATUS" >&2
            print_failing_logs
            cmd_down >/dev/null
            exit 1
        fi
        tick 0.1
    done
    local t1
    t1=$(now_ms)
    echo "pi2: run '$RUN' up in $(((t1 - t0) / 1000)).$(printf '%03d' $(((t1 - t0) % 1000))) s: ${P_NAME[*]}" >&2
}

cmd_status() {
    parse_run_only status "$@"
    [ -d "$RD" ] || die "run '$RUN' is not up (no $RD)"
    load_stack_env
    local sp
    sp=$(supervisor_pid)
    echo "run $RUN: model $MODEL"
    if [ "$sp" -gt 0 ]; then
        echo "supervisor: pid $sp"
    elif [ -f "$RD/stopped" ]; then
        echo "supervisor: stopped the stack: $(cat "$RD/stopped") (pi2 down -r $RUN removes the logs)"
    else
        echo "supervisor: not running (pi2 down -r $RUN cleans up)"
    fi
    "$BIN_DIR/pi2-ctl" -r "$RUN" status || true
    echo "supervisor's view (configured CPUs and threads, restarts it made):"
    local i name p restarts
    printf '%-16s %8s %-10s %7s %8s\n' process pid cpus threads restarts
    for i in "${!P_NAME[@]}"; do
        name=${P_NAME[$i]}
        p=$(proc_pid "$name")
        restarts=$(awk -v n="$name" '$1 == n { print $3 }' "$RD/supervisor.state" 2>/dev/null)
        [ "$p" -gt 0 ] || p=-
        printf '%-16s %8s %-10s %7s %8s\n' "$name" "$p" "${P_CPUS[$i]:-any}" "${P_THREADS[$i]}" "${restarts:-0}"
    done
}

# parse_proc_args: PROC [-r RUN] plus extra words into ARGS
parse_proc_args() {
    PROC="" ARGS=()
    while [ $# -gt 0 ]; do
        case $1 in
        -r) set_run "$2"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) if [ -z "$PROC" ]; then PROC=$1; else ARGS+=("$1"); fi; shift ;;
        esac
    done
    [ -n "$RD" ] || set_run "$RUN"
    [ -n "$PROC" ] || die "$CMD_NAME: which process? (e.g. cpu-worker.0)"
}

cmd_restart() {
    CMD_NAME=restart parse_proc_args "$@"
    load_stack_env
    proc_index "$PROC" >/dev/null
    [ "$(supervisor_pid)" -gt 0 ] || die "run '$RUN' has no supervisor running"
    local p
    p=$(proc_pid "$PROC")
    [ "$p" -gt 0 ] || die "$PROC is not running (the supervisor is already restarting it)"
    echo "pi2 restart" >"$RD/restart.$PROC"
    kill -TERM "$p"
    local deadline=$(($(now_ms) + (STOP_GRACE_S + 5) * 1000)) np=0
    while (($(now_ms) < deadline)); do
        np=$(proc_pid "$PROC")
        [ "$np" -gt 0 ] && [ "$np" != "$p" ] && break
        tick
    done
    [ "$np" -gt 0 ] && [ "$np" != "$p" ] || die "$PROC (pid $p) did not come back"
    echo "pi2: $PROC restarted: pid $p -> $np"
}

cmd_logs() {
    CMD_NAME=logs parse_proc_args "$@"
    load_stack_env
    [ "$PROC" = supervisor ] || proc_index "$PROC" >/dev/null
    local log="$RD/logs/$PROC.log"
    [ -f "$log" ] || die "no log $log"
    if [ "${ARGS[*]:-}" = "-f" ]; then exec tail -n 50 -f "$log"; fi
    [ ${#ARGS[@]} -eq 0 ] || die "logs: unknown argument '${ARGS[0]}'"
    cat "$log"
}

cmd_profile() {
    CMD_NAME=profile parse_proc_args "$@"
    load_stack_env
    proc_index "$PROC" >/dev/null
    local secs=${ARGS[0]:-5} p data
    check_count "$secs" SECONDS profile 1 3600
    command -v perf >/dev/null || die "profile: perf is not installed (Debian: linux-perf)"
    p=$(proc_pid "$PROC")
    [ "$p" -gt 0 ] || die "$PROC is not running"
    # kept with the logs, for call graphs: perf report -i DATA
    data=$RD/logs/$PROC.perf.data
    echo "pi2: profiling $PROC (pid $p) for $secs s (cpu-clock samples, call graphs into $data)" >&2
    perf record -q -e cpu-clock -g -p "$p" -o "$data" -- sleep "$secs" >/dev/null 2>&1 ||
        die "profile: perf record failed"
    perf report -i "$data" --stdio --no-children -F overhead,dso,sym -g none 2>/dev/null |
        grep -v '^#' | grep -v '^$' >"$data.txt" || true
    echo "# $PROC (pid $p), $secs s: share of cpu-clock samples per symbol ([k] kernel, [.] user)"
    awk '{ v = $1 + 0; if ($3 == "[k]") k += v; else u += v }
         END { printf "# total: user %.1f %%, kernel %.1f %%\n", u, k }' "$data.txt"
    awk '$1 + 0 >= 0.5' "$data.txt" | head -n 30
    rm -f "$data.txt"
}

cmd_run() {
    local args=()
    while [ $# -gt 0 ]; do
        case $1 in
        -r) set_run "$2"; shift 2 ;;
        --dense) args+=(--ffn dense); shift ;;
        *) args+=("$1"); shift ;;
        esac
    done
    [ -n "$RD" ] || set_run "$RUN"
    exec "$BIN_DIR/pi2-client" -r "$RUN" "${args[@]}"
}

cmd_rundir() {
    case ${1:-} in
    -r) set_run "$2" ;;
    "") set_run "$RUN" ;;
    *) die "rundir: unknown argument '$1'" ;;
    esac
    echo "$RD"
}

main() {
    [ $# -gt 0 ] || { usage >&2; exit 2; }
    local cmd=$1
    shift
    case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    restart) cmd_restart "$@" ;;
    logs) cmd_logs "$@" ;;
    profile) cmd_profile "$@" ;;
    run) cmd_run "$@" ;;
    rundir) cmd_rundir "$@" ;;
    plan) exec "$BIN_DIR/planner" "$@" ;;
    __supervise) supervise "$@" ;;
    -h | --help | help) usage ;;
    *) echo "pi2: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
    esac
}

main "$@"
