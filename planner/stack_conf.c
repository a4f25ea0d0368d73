/* Stack configs for the planner (stack_conf.h). */
#include "stack_conf.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "util/log.h"

static void add_placement(stack_conf *c, const char *line) {
    const size_t used = strlen(c->placement);
    snprintf(c->placement + used, sizeof c->placement - used, "%s%s", used ? "\n" : "", line);
}

/* The CPUs of a line's cpus=LIST (as taskset takes it: "0", "0-1", "0,2-3"); false: no cpus= */
static bool line_cpus(const char *line, cpu_set_t *set, bool *bad) {
    CPU_ZERO(set);
    *bad = false;
    const char *p = strstr(line, "cpus=");
    if (!p) return false;
    p += 5;
    for (;;) {
        char *end;
        const long lo = strtol(p, &end, 10);
        long hi = lo;
        if (end == p || lo < 0) break;
        p = end;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || hi < lo) break;
            p = end;
        }
        for (long c = lo; c <= hi && c < CPU_SETSIZE; c++) CPU_SET((int)c, set);
        if (*p != ',') return true;
        p++;
    }
    *bad = true;
    return true;
}

int stack_conf_read(const char *path, int n_cpus, stack_conf *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->max_prefill = PREFILL_TOKENS;
    c->checksums = true;
    if (!path) {
        c->n_processes = 6, c->cpu_workers = 2, c->threads = 2;
        c->io_shares_compute = true;
        add_placement(c, "npu-worker cpus=0-1 threads=2");
        add_placement(c, "cpu-worker cpus=0 threads=1");
        add_placement(c, "cpu-worker cpus=1 threads=1");
        return 0;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        err_set(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char line[512];
    int no = 0, rc = 0;
    cpu_set_t io_cpus, compute_cpus;
    CPU_ZERO(&compute_cpus);
    bool io_pinned = false, compute_unpinned = false;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        no++;
        line[strcspn(line, "\r\n")] = '\0';
        char name[64];
        if (sscanf(line, " %63s", name) != 1 || name[0] == '#') continue;
        if (!strncmp(name, "max-prefill=", 12)) { /* the stack's prompt buffers are sized for it */
            if (sscanf(name + 12, "%d", &c->max_prefill) != 1 || c->max_prefill < 1 || c->max_prefill > 65536) {
                err_set(err, errlen, "%s:%d: max-prefill= is not a number in 1..65536", path, no);
                rc = -1;
                break;
            }
            c->max_prefill_set = true;
            continue;
        }
        if (!strcmp(name, "bundle-checksums=off")) {
            c->checksums = false;
            continue;
        }
        if (strchr(name, '=')) continue; /* ctx=, prefill-stall=: not the planner's */
        int threads = 1;
        const char *t = strstr(line, "threads=");
        if (t && (sscanf(t, "threads=%d", &threads) != 1 || threads < 1 || threads > 1024)) {
            err_set(err, errlen, "%s:%d: threads= is not a number in 1..1024", path, no);
            rc = -1;
            break;
        }
        cpu_set_t cpus;
        bool bad;
        const bool pinned = line_cpus(line, &cpus, &bad);
        if (bad) {
            err_set(err, errlen, "%s:%d: cpus= is not a CPU list such as 0,2-3", path, no);
            rc = -1;
            break;
        }
        if (!strcmp(name, "io-worker")) io_pinned = pinned, io_cpus = cpus;
        if (!strcmp(name, "cpu-worker") && pinned) CPU_OR(&compute_cpus, &compute_cpus, &cpus);
        if (!strcmp(name, "cpu-worker") && !pinned) compute_unpinned = true;
        c->n_processes++;
        if (strcmp(name, "cpu-worker") == 0) c->cpu_workers++, c->threads += threads;
        if (strcmp(name, "cpu-worker") == 0 || strcmp(name, "npu-worker") == 0) add_placement(c, line);
    }
    fclose(f);
    if (io_pinned && !compute_unpinned) {
        cpu_set_t both;
        CPU_AND(&both, &io_cpus, &compute_cpus);
        c->io_shares_compute = CPU_COUNT(&both) > 0;
    } else {
        c->io_shares_compute = c->threads >= n_cpus;
    }
    if (rc == 0 && c->cpu_workers == 0) {
        err_set(err, errlen, "%s: no cpu-worker line: the stack would have nothing to decode with", path);
        rc = -1;
    }
    return rc;
}
