#include "phase_clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

static const char *const phase_names[PHASE_COUNT] = {
    "prefetch", "attention", "wait", "attn-out", "wait", "pred-hidden", "wait", "ffn", "wait", "ffn-out", "wait", "output",
};

void phase_clock_init(phase_clock *c) {
    const char *env = getenv("PI2_PHASE_TIMES");
    *c = (phase_clock){.on = env && strcmp(env, "0") && *env};
}

void phase_clock_start(phase_clock *c) {
    if (c->on) c->mark_ns = clock_ns();
}

void phase_clock_lap(phase_clock *c, decode_phase p) {
    if (!c->on) return;
    uint64_t t = clock_ns();
    c->ns[p] += t - c->mark_ns;
    c->mark_ns = t;
    if (p == PHASE_OUTPUT) c->tokens++;
}

void phase_clock_log(const phase_clock *c, const char *who) {
    if (!c->on || !c->tokens) return;
    char line[512];
    int len = 0;
    double total = 0;
    for (int p = 0; p < PHASE_COUNT; p++) {
        double ms = c->ns[p] / 1e6 / (double)c->tokens;
        total += ms;
        len += snprintf(line + len, sizeof line - (size_t)len, " %s %.2f", phase_names[p], ms);
    }
    log_info("%s phase times over %llu tokens, ms per token:%s; total %.2f", who, (unsigned long long)c->tokens, line,
             total);
}
