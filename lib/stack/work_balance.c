#include "stack/work_balance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cut[] from share[]: rounded prefix sums, each worker at least one unit. */
static void make_cuts(work_balance *b) {
    double sum = 0;
    b->cut[0] = 0;
    for (int i = 0; i < b->n; i++) {
        sum += b->share[i];
        uint32_t at = (uint32_t)(sum * WORK_SHARE_ONE + 0.5);
        uint32_t least = b->cut[i] + 1, most = WORK_SHARE_ONE - (uint32_t)(b->n - 1 - i);
        b->cut[i + 1] = i + 1 == b->n ? WORK_SHARE_ONE : at < least ? least : at > most ? most : at;
    }
}

/* share[] scaled to sum 1, none under the floor (raised ones are taken from the others in proportion). */
static void normalize(work_balance *b) {
    const double floor_share = WORK_BALANCE_MIN_OF_EVEN / b->n;
    for (int round = 0; round < 2; round++) { /* a second round settles what the first raise moved */
        double sum = 0;
        for (int i = 0; i < b->n; i++) sum += b->share[i];
        for (int i = 0; i < b->n; i++) b->share[i] /= sum;
        double raised = 0, rest = 0;
        for (int i = 0; i < b->n; i++) {
            if (b->share[i] < floor_share) raised += floor_share - b->share[i], b->share[i] = floor_share;
            else rest += b->share[i];
        }
        if (raised == 0 || rest == 0) break;
        for (int i = 0; i < b->n; i++)
            if (b->share[i] > floor_share) b->share[i] -= raised * b->share[i] / rest;
    }
}

int work_balance_parse(work_balance *b, const char *spec, int n_workers, char *err, size_t errlen) {
    memset(b, 0, sizeof *b);
    if (n_workers < 1 || n_workers > STACK_MAX_CPU_WORKERS) {
        snprintf(err, errlen, "%d cpu-workers: the split takes 1 to %d", n_workers, STACK_MAX_CPU_WORKERS);
        return -1;
    }
    b->n = n_workers;
    for (int i = 0; i < n_workers; i++) b->share[i] = 1.0 / n_workers;
    if (!strcmp(spec, "auto") || !strcmp(spec, "even")) {
        b->adaptive = !strcmp(spec, "auto");
        for (int i = 0; i < n_workers; i++) work_share_even_cut(i, n_workers, &b->cut[i], &b->cut[i + 1]);
        return 0;
    }
    const char *p = spec;
    for (int i = 0; i < n_workers; i++) {
        char *end;
        double w = strtod(p, &end);
        if (end == p || !(w > 0) || w > 1e6) {
            snprintf(err, errlen, "split '%s': weight %d is not a number in (0, 1e6]", spec, i + 1);
            return -1;
        }
        b->share[i] = w;
        p = end;
        if (i + 1 < n_workers && *p++ != ',') {
            snprintf(err, errlen, "split '%s': %d weights for %d cpu-workers (or auto, even)", spec, i + 1,
                     n_workers);
            return -1;
        }
    }
    if (*p) {
        snprintf(err, errlen, "split '%s': more than the %d weights of the cpu-workers (or auto, even)", spec,
                 n_workers);
        return -1;
    }
    double sum = 0;
    for (int i = 0; i < n_workers; i++) sum += b->share[i];
    for (int i = 0; i < n_workers; i++) b->share[i] /= sum;
    make_cuts(b);
    return 0;
}

/* Worker i did share[i] of the work in busy[i]: its speed is share / busy,
 * and the split that would have made them finish together gives each its
 * speed's part of the sum. */
void work_balance_update(work_balance *b, const uint64_t *busy_ns) {
    if (!b->adaptive || b->n < 2) return;
    double speed[STACK_MAX_CPU_WORKERS], total = 0;
    for (int i = 0; i < b->n; i++) {
        if (!busy_ns[i]) return;
        speed[i] = b->share[i] / (double)busy_ns[i];
        total += speed[i];
    }
    for (int i = 0; i < b->n; i++) b->share[i] += WORK_BALANCE_GAIN * (speed[i] / total - b->share[i]);
    normalize(b);
    make_cuts(b);
}

void work_balance_publish(const work_balance *b, stack_ctl *ctl) {
    for (int i = 0; i <= b->n; i++) atomic_store(&ctl->split_cut[i], b->cut[i]);
    atomic_store(&ctl->split_mode, b->adaptive ? 2u : 1u);
}

int work_balance_describe(const stack_ctl *ctl, char *buf, size_t len) {
    const uint32_t mode = atomic_load(&ctl->split_mode);
    const int n = ctl->params.n_cpu_workers;
    if (!mode || n < 1 || n > STACK_MAX_CPU_WORKERS || !len) return -1;
    int at = snprintf(buf, len, "decode split (%s):", mode == 2 ? "balanced" : "fixed");
    uint32_t begin = atomic_load(&ctl->split_cut[0]);
    for (int i = 0; i < n && at >= 0 && (size_t)at < len; i++) {
        const uint32_t end = atomic_load(&ctl->split_cut[i + 1]);
        if (end < begin || end > WORK_SHARE_ONE) return -1;
        at += snprintf(buf + at, len - (size_t)at, "%s cpu-worker.%d %.1f %%", i ? "," : "", i,
                       100.0 * (end - begin) / WORK_SHARE_ONE);
        begin = end;
    }
    return 0;
}
