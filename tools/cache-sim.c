/* cache-sim: LRU and CLOCK over the cold bundle lookups the cpu-workers of a
 * budgeted stack traced (PI2_BUNDLE_TRACE=PREFIX, one file per worker), at
 * the cold slot counts asked for: which policy keeps more of what comes back
 * (docs/offload.md). The workers' files are replayed layer step by layer step,
 * each step's lookups one worker after the other, as they share the slots. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stack/cache_sim.h"
#include "util/cli.h"
#include "util/log.h"

#define MAX_TRACES 16
#define MAX_SIZES 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: cache-sim -s SLOTS[,SLOTS...] TRACE...\n"
            "Replays the cold bundle lookups of a budgeted stack's cpu-workers (written with\n"
            "PI2_BUNDLE_TRACE=PREFIX to PREFIX.cpu-worker.N) through LRU and through the slot table's\n"
            "CLOCK, for each number of cold slots, and prints each one's hit rate.\n"
            "  -s, --slots LIST   cold slot counts (e.g. the plan's: pi2 plan show)\n"
            "  -h, --help         this text\n");
}

typedef struct {
    const char *path;
    uint32_t *rec; /* (layer, bundle) pairs and (CACHE_TRACE_STEP_END, 0) */
    size_t n, at;
} trace;

/* The whole file; -1 with the reason logged when it cannot be read or is not whole pairs. */
static int read_trace(trace *t, const char *path) {
    t->path = path;
    FILE *f = fopen(path, "rb");
    if (!f) { log_error("%s: %s", path, strerror(errno)); return -1; }
    size_t cap = 0;
    for (;;) {
        if (t->n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            uint32_t *r = realloc(t->rec, sizeof *r * cap);
            if (!r) { log_error("%s: out of memory", path); fclose(f); return -1; }
            t->rec = r;
        }
        const size_t got = fread(t->rec + t->n, sizeof *t->rec, cap - t->n, f);
        t->n += got;
        if (got == 0) break;
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad || t->n % 2) {
        log_error("%s: %s", path, bad ? "read error" : "ends inside a record (not a PI2_BUNDLE_TRACE file?)");
        return -1;
    }
    return 0;
}

static int parse_sizes(const char *arg, uint32_t *sizes, int *n) {
    char *copy = strdup(arg), *save = NULL;
    *n = 0;
    for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
        int v;
        if (*n == MAX_SIZES || cli_parse_int(tok, "--slots", 1, 1 << 30, &v)) { free(copy); return -1; }
        sizes[(*n)++] = (uint32_t)v;
    }
    free(copy);
    return *n ? 0 : -1;
}

/* Each step of every trace in turn through s; counts lookups and hits. */
static void replay(trace *tr, int n_tr, uint32_t n_bundles, cache_sim *s, uint64_t *refs, uint64_t *hits) {
    *refs = *hits = 0;
    for (int i = 0; i < n_tr; i++) tr[i].at = 0;
    for (bool more = true; more;) {
        more = false;
        for (int i = 0; i < n_tr; i++) {
            trace *t = &tr[i];
            while (t->at < t->n && t->rec[t->at] != CACHE_TRACE_STEP_END) {
                *hits += cache_sim_ref(s, (uint64_t)t->rec[t->at] * n_bundles + t->rec[t->at + 1]);
                ++*refs;
                t->at += 2;
            }
            if (t->at < t->n) t->at += 2, more = true;
        }
    }
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    uint32_t sizes[MAX_SIZES];
    int n_sizes = 0, i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
        if ((!strcmp(argv[i], "-s") || !strcmp(argv[i], "--slots")) && i + 1 < argc) {
            if (parse_sizes(argv[++i], sizes, &n_sizes)) { log_error("--slots: a list of counts, at most %d", MAX_SIZES); return 2; }
        } else {
            usage(stderr);
            return 2;
        }
    }
    const int n_tr = argc - i;
    if (!n_sizes || n_tr < 1 || n_tr > MAX_TRACES) { usage(stderr); return 2; }
    trace tr[MAX_TRACES] = {0};
    uint32_t n_layer = 0, n_bundles = 0;
    int rc = 0;
    for (int k = 0; k < n_tr && !rc; k++) {
        rc = read_trace(&tr[k], argv[i + k]);
        for (size_t r = 0; !rc && r < tr[k].n; r += 2) {
            if (tr[k].rec[r] == CACHE_TRACE_STEP_END) continue;
            if (tr[k].rec[r] >= 1u << 16) { log_error("%s: record %zu names layer %u", tr[k].path, r / 2, tr[k].rec[r]); rc = -1; }
            if (tr[k].rec[r] >= n_layer) n_layer = tr[k].rec[r] + 1;
            if (tr[k].rec[r + 1] >= n_bundles) n_bundles = tr[k].rec[r + 1] + 1;
        }
    }
    for (int k = 0; k < n_sizes && !rc; k++) {
        uint64_t refs[2], hits[2];
        for (int p = 0; p < 2 && !rc; p++) {
            cache_sim *s = cache_sim_new(p ? CACHE_SIM_CLOCK : CACHE_SIM_LRU, sizes[k], (uint64_t)n_layer * n_bundles);
            if (!s) { log_error("out of memory"); rc = -1; break; }
            replay(tr, n_tr, n_bundles, s, &refs[p], &hits[p]);
            cache_sim_free(s);
        }
        if (!rc)
            printf("%u slots: %llu cold lookups, LRU %.2f %% hits, CLOCK %.2f %% hits\n", sizes[k],
                   (unsigned long long)refs[0], refs[0] ? 100.0 * hits[0] / refs[0] : 0.0,
                   refs[1] ? 100.0 * hits[1] / refs[1] : 0.0);
    }
    for (int k = 0; k < n_tr; k++) free(tr[k].rec);
    return rc ? 1 : 0;
}
