/* Per-peer rate limits (peer_limit.h). */
#include "stack/peer_limit.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

static peer_limit_entry *find(peer_limit *t, const void *id, size_t id_len) {
    for (int i = 0; i < t->n; i++)
        if (t->e[i].id_len == id_len && !memcmp(t->e[i].id, id, id_len)) return &t->e[i];
    return NULL;
}

/* A free slot, else the one quiet for longest (its held count is forgotten). */
static peer_limit_entry *take_slot(peer_limit *t) {
    if (t->n < PEER_LIMIT_SLOTS) return &t->e[t->n++];
    peer_limit_entry *old = &t->e[0];
    for (int i = 1; i < t->n; i++)
        if (t->e[i].seen_ms < old->seen_ms) old = &t->e[i];
    return old;
}

bool peer_limit_allow(peer_limit *t, const void *id, size_t id_len, int64_t now_ms, uint64_t *held) {
    if (id_len > BUS_PEER_MAX) id_len = BUS_PEER_MAX;
    peer_limit_entry *e = find(t, id, id_len);
    if (!e) {
        e = take_slot(t);
        memcpy(e->id, id, id_len);
        e->id_len = id_len;
        e->held = 0;
        e->allowed_ms = now_ms - PEER_LIMIT_MS;
    }
    e->seen_ms = now_ms;
    if (now_ms - e->allowed_ms < PEER_LIMIT_MS) {
        e->held++;
        return false;
    }
    *held = e->held;
    e->held = 0;
    e->allowed_ms = now_ms;
    return true;
}

bool peer_limit_overdue(peer_limit *t, int64_t now_ms, peer_limit_entry *out) {
    for (int i = 0; i < t->n; i++) {
        peer_limit_entry *e = &t->e[i];
        if (!e->held || now_ms - e->allowed_ms < PEER_LIMIT_MS) continue;
        *out = *e;
        e->held = 0;
        e->allowed_ms = now_ms;
        return true;
    }
    return false;
}

void peer_limit_warn(peer_limit *t, const void *id, size_t id_len, const char *fmt, ...) {
    uint64_t held;
    if (!peer_limit_allow(t, id, id_len, clock_ms(), &held)) return;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (held) log_warn("%s (and %llu more held back)", text, (unsigned long long)held);
    else log_warn("%s", text);
}

void peer_limit_report(peer_limit *t, const char *what, int64_t now_ms) {
    peer_limit_entry e;
    while (peer_limit_overdue(t, now_ms, &e))
        log_warn("%llu more %s '%.*s' held back", (unsigned long long)e.held, what, (int)e.id_len, (const char *)e.id);
}
