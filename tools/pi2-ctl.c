/* pi2-ctl: the supervisor's view of a run, from its control segment.
 *   status      the process table (with RSS and CPU affinity from /proc), weights_ready, segments
 *   cleanup     remove the run's segments and run directory
 *   wait-ready  wait until cachemgr has loaded the weights */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stack/exit_codes.h"
#include "util/cli.h"
#include "util/clock.h"
#include "util/log.h"
#include "stack/neuron_cache.h"
#include "stack/offload.h"
#include "stack/rundir.h"
#include "stack/shm.h"
#include "stack/stack.h"
#include "stack/work_balance.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2-ctl [-r RUNID] COMMAND [--timeout S]\n"
            "Commands:\n"
            "  status      processes of the run (pid, state, heartbeat age, tokens, restarts, RSS,\n"
            "              CPU affinity; \"stalled\": ready or busy, no beat for 1 s), weights_ready,\n"
            "              under a memory budget each cpu-worker's neuron cache (hit rates, reads,\n"
            "              I/O wait, FFN time per layer), the segments\n"
            "  cleanup     remove the run's shared-memory segments and run directory\n"
            "  wait-ready  wait until the weights are loaded (exit 1 after --timeout S, default 120)\n"
            "  -r, --run RUNID   run id (default: $PI2_RUN, else \"default\")\n"
            "  -h, --help        this help\n");
}

static const char *seg_whats[] = {STACK_SEG_WEIGHTS, STACK_SEG_KV, STACK_SEG_ACT, STACK_SEG_CTL};
static const enum shm_kind seg_kinds[] = {SHM_KIND_WEIGHTS, SHM_KIND_KV, SHM_KIND_ACTIVATIONS, SHM_KIND_CONTROL};

/* Attaches the run's control segment read-only; NULL (err set) if absent or not initialised. */
static shm_segment *attach_ctl(const char *runid, const stack_ctl **ctl, char *err, size_t errlen) {
    char name[SHM_NAME_MAX];
    if (shm_make_name(name, sizeof name, runid, STACK_SEG_CTL)) {
        snprintf(err, errlen, "%s", shm_last_error());
        return NULL;
    }
    shm_segment *seg = shm_attach(name, SHM_KIND_CONTROL, SHM_ATTACH_READONLY);
    if (!seg) {
        snprintf(err, errlen, "run '%s' does not exist (%s)", runid, shm_last_error());
        return NULL;
    }
    uint64_t bytes = 0;
    *ctl = shm_region_ptr(seg, "ctl", &bytes);
    if (!*ctl || bytes < sizeof(stack_ctl) || (*ctl)->magic != STACK_CTL_MAGIC) {
        snprintf(err, errlen, "run '%s': the control block is not initialised yet", runid);
        shm_detach(seg);
        return NULL;
    }
    return seg;
}

/* ---- status ---- */

static const char *state_name(uint32_t st) {
    static const char *names[] = {"empty", "starting", "ready", "busy", "stopping", "exited"};
    return st < sizeof names / sizeof *names ? names[st] : "?";
}

/* "0-1,3" into buf; "?" if the affinity cannot be read. */
static void affinity_list(pid_t pid, char *buf, size_t len) {
    cpu_set_t set;
    if (sched_getaffinity(pid, sizeof set, &set)) {
        snprintf(buf, len, "?");
        return;
    }
    size_t at = 0;
    buf[0] = 0;
    for (int c = 0; c < CPU_SETSIZE && at < len; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        int end = c;
        while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &set)) end++;
        int n = end > c ? snprintf(buf + at, len - at, "%s%d-%d", at ? "," : "", c, end)
                        : snprintf(buf + at, len - at, "%s%d", at ? "," : "", c);
        if (n < 0) break;
        at += (size_t)n;
        c = end;
    }
}

/* Resident set size in kB from /proc/<pid>/status; -1 if unknown. */
static long rss_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}

/* Every process beats at least every 200 ms (compute workers from a thread
 * of their own): a ready or busy one silent this long is stuck. */
#define STALL_MS 1000

/* What the state column shows: a live ready/busy process whose beat is too old is "stalled". */
static const char *shown_state(const proc_row *r, bool alive, int64_t age_ms) {
    if (!alive) return "dead";
    uint32_t st = atomic_load(&r->state);
    if ((st == PROC_READY || st == PROC_BUSY) && age_ms > STALL_MS) return "stalled";
    return state_name(st);
}

static void print_process(const proc_row *r) {
    pid_t pid = atomic_load(&r->pid);
    bool alive = pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
    /* the clock read after the beat: a beat landing between one clock reading for the table and its
     * row showed as -1 ms */
    const int64_t beat = atomic_load(&r->heartbeat_ms);
    int64_t age = clock_ms() - beat;
    char cpus[256] = "-", rss[32] = "-";
    if (alive) {
        affinity_list(pid, cpus, sizeof cpus);
        long kb = rss_kb(pid);
        if (kb >= 0) snprintf(rss, sizeof rss, "%.1f", kb / 1024.0);
    }
    uint32_t starts = atomic_load(&r->starts);
    printf("%-16.*s %8d %-9s %10lld %10llu %8u %10s  %s\n", (int)sizeof r->name, r->name, (int)pid,
           shown_state(r, alive, age), (long long)age,
           (unsigned long long)atomic_load(&r->tokens_served), starts ? starts - 1 : 0, rss, cpus);
}

/* The cold cache's slots now: pinned (a worker computing from them) and loading. */
static void print_slot_census(const char *runid) {
    char name[SHM_NAME_MAX], err[256];
    shm_segment *seg = shm_make_name(name, sizeof name, runid, STACK_SEG_FFN)
                           ? NULL
                           : shm_attach(name, SHM_KIND_SLOTS, SHM_ATTACH_READONLY | SHM_ATTACH_NO_POPULATE);
    ncache *c = seg ? offload_cache_attach(seg, err, sizeof err) : NULL;
    if (c) {
        uint32_t pinned, loading;
        ncache_census(c, &pinned, &loading);
        printf("cold slots: %u, %u pinned now, %u loading\n", ncache_shape_of(c)->n_slots, pinned, loading);
        ncache_detach(c);
    } else {
        printf("cold slots: unknown (%s)\n", seg ? err : shm_last_error());
    }
    shm_detach(seg);
}

/* Under a budget, each cpu-worker's neuron cache since the stack started:
 * totals, shares of them, and averages per token and per layer step. */
static void print_offload(const stack_ctl *ctl) {
    printf("neuron cache (since start; per token and per layer: averages):\n");
    printf("  %-14s %8s %6s %6s %6s %6s %12s %10s %11s %8s %8s %12s\n", "worker", "tokens", "hot%", "cold%", "read%",
           "ahead%", "read_bundles", "read_MB", "bundles/tok", "MB/tok", "io_wait%", "ffn_ms/layer");
    for (int i = 0; i < STACK_MAX_PROCS; i++) {
        const proc_row *row = &ctl->procs[i];
        if (strncmp(row->name, "cpu-worker.", strlen("cpu-worker."))) continue;
        const offload_tally t = offload_counters_read(&row->offload);
        const offload_rates r = offload_tally_rates(&t);
        char who[sizeof row->name + 2];
        snprintf(who, sizeof who, "%.*s:", (int)sizeof row->name, row->name); /* not a process-table row */
        printf("  %-14s %8llu %6.1f %6.1f %6.1f %6.1f %12llu %10.1f %11.1f %8.3f %8.1f %12.3f\n", who,
               (unsigned long long)t.tokens, 100 * r.hot, 100 * r.cold, 100 * r.read, 100 * r.ahead,
               (unsigned long long)t.misses,
               t.bytes_read / 1e6, r.bundles_per_token, r.bytes_per_token / 1e6, 100 * r.wait_share, r.ms_per_layer);
    }
}

static void print_segments(const char *runid) {
    printf("segments:\n");
    for (size_t i = 0; i < sizeof seg_whats / sizeof *seg_whats; i++) {
        char name[SHM_NAME_MAX];
        if (shm_make_name(name, sizeof name, runid, seg_whats[i])) continue;
        /* Read-only and unpopulated: the header is all we look at, even for a multi-GB segment. */
        int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
        struct stat st;
        if (fd < 0 || fstat(fd, &st)) {
            printf("  %-24s missing\n", name);
            if (fd >= 0) close(fd);
            continue;
        }
        struct shm_header h;
        bool valid = pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h &&
                     shm_validate_header(&h, (uint64_t)st.st_size, seg_kinds[i]) == 0;
        close(fd);
        printf("  %-24s %14lld bytes", name, (long long)st.st_size);
        if (!valid) {
            printf("  invalid header: %s\n", shm_last_error());
            continue;
        }
        printf("  generation %llu\n", (unsigned long long)h.generation);
        for (uint32_t k = 0; k < h.n_regions; k++)
            printf("    region %-8s offset %14llu size %14llu\n", h.regions[k].name,
                   (unsigned long long)h.regions[k].offset, (unsigned long long)h.regions[k].size);
    }
}

static int cmd_status(const char *runid) {
    char err[512];
    const stack_ctl *ctl;
    shm_segment *seg = attach_ctl(runid, &ctl, err, sizeof err);
    if (!seg) {
        log_error("%s", err);
        return 1;
    }
    printf("run %s\nmodel %.*s (%llu bytes)\n", runid, (int)sizeof ctl->model_path, ctl->model_path,
           (unsigned long long)ctl->model_size);
    printf("n_ctx %d, cpu-workers %d, max prefill %d\n", ctl->params.n_ctx, ctl->params.n_cpu_workers,
           ctl->params.max_prefill);
    char ffn[sizeof ctl->predictor_path + 64]; /* ffn_mode_name names any value; the path is read bounded */
    ffn_mode_describe(ffn, sizeof ffn, (ffn_mode)ctl->params.ffn_mode, ctl->predictor_path, sizeof ctl->predictor_path);
    printf("ffn %s\n", ffn);
    printf("weights_ready %llu\nepoch %llu\n", (unsigned long long)atomic_load(&ctl->weights_ready),
           (unsigned long long)atomic_load(&ctl->epoch));
    printf("%-16s %8s %-9s %10s %10s %8s %10s  %s\n", "process", "pid", "state", "beat_ms", "tokens", "restarts",
           "rss_MiB", "cpus");
    for (int i = 0; i < STACK_MAX_PROCS; i++)
        if (ctl->procs[i].name[0]) print_process(&ctl->procs[i]);
    char split[STACK_MAX_CPU_WORKERS * 32 + 32];
    if (!work_balance_describe(ctl, split, sizeof split)) printf("%s\n", split);
    if (ctl->plan_path[0]) {
        print_offload(ctl);
        print_slot_census(runid);
    }
    shm_detach(seg);
    print_segments(runid);
    return 0;
}

/* ---- cleanup ---- */

static void print_name(const char *name, void *ctx) {
    (void)ctx;
    printf("removing segment %s\n", name);
}

static int cmd_cleanup(const char *runid) {
    char prefix[SHM_NAME_MAX], dir[RUNDIR_PATH_MAX], logs[RUNDIR_PATH_MAX + 8];
    snprintf(prefix, sizeof prefix, "pi2-%s-", runid);
    if (rundir_path(dir, sizeof dir, runid)) {
        log_error("run '%s': %s", runid, rundir_last_error());
        return 1;
    }
    int status = 0;
    shm_list_prefix(prefix, print_name, NULL);
    int n = shm_unlink_run(runid);
    if (n < 0) {
        log_error("removing the segments of run '%s': %s", runid, shm_last_error());
        status = 1;
    }
    struct stat st;
    bool have_dir = lstat(dir, &st) == 0;
    if (have_dir) {
        /* The supervisor keeps its logs in a subdirectory, which rundir_remove leaves alone. */
        snprintf(logs, sizeof logs, "%s/logs", dir);
        if ((lstat(logs, &st) == 0 && rundir_remove(logs)) || rundir_remove(dir)) {
            log_error("removing %s: %s", dir, rundir_last_error());
            status = 1;
        } else {
            printf("removed run directory %s\n", dir);
        }
    }
    if (n == 0 && !have_dir) printf("run %s: nothing to remove\n", runid);
    return status;
}

/* ---- wait-ready ---- */

static int cmd_wait_ready(const char *runid, double timeout_s) {
    double t0 = clock_seconds();
    char err[512] = "";
    for (;;) {
        const stack_ctl *ctl;
        shm_segment *seg = attach_ctl(runid, &ctl, err, sizeof err);
        if (seg) {
            uint64_t ready = atomic_load(&ctl->weights_ready);
            shm_detach(seg);
            if (ready) {
                printf("run %s: weights ready (generation %llu)\n", runid, (unsigned long long)ready);
                return 0;
            }
            snprintf(err, sizeof err, "run '%s': the weights are still loading", runid);
        }
        if (clock_seconds() - t0 > timeout_s) {
            log_error("not ready after %.1f s: %s", timeout_s, err);
            return 1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    static const struct option longopts[] = {{"run", required_argument, 0, 'r'},
                                             {"timeout", required_argument, 0, 't'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *runid = cli_default_runid();
    double timeout_s = 120;
    int c;
    while ((c = getopt_long(argc, argv, "r:t:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'r': runid = optarg; break;
        case 't': if (cli_parse_double(optarg, "--timeout", 0, 1e7, &timeout_s)) return PI2_EXIT_USAGE; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return PI2_EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        log_error(optind == argc ? "no command given" : "one command expected");
        usage(stderr);
        return PI2_EXIT_USAGE;
    }
    char probe[SHM_NAME_MAX];
    if (shm_make_name(probe, sizeof probe, runid, STACK_SEG_CTL)) {
        log_error("%s", shm_last_error());
        return PI2_EXIT_USAGE;
    }
    const char *cmd = argv[optind];
    if (!strcmp(cmd, "status")) return cmd_status(runid);
    if (!strcmp(cmd, "cleanup")) return cmd_cleanup(runid);
    if (!strcmp(cmd, "wait-ready")) return cmd_wait_ready(runid, timeout_s);
    log_error("unknown command '%s'", cmd);
    usage(stderr);
    return PI2_EXIT_USAGE;
}
