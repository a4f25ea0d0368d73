/* Per-peer rate limit of log lines and error replies about untrusted input: a
 * flood from one identity costs one line (and one reply) a second, and the
 * next line counts what was held back meanwhile. The table is bounded: a
 * flood of fresh identities evicts the longest-quiet entry instead of growing
 * memory.
 *
 * Errors: none: a full table evicts an entry instead of failing, and the
 * functions log (log_warn) rather than return a status. */
#ifndef PI2_PEER_LIMIT_H
#define PI2_PEER_LIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stack/bus.h"

#define PEER_LIMIT_SLOTS 32
#define PEER_LIMIT_MS 1000 /* one line per peer this often */

typedef struct {
    uint8_t id[BUS_PEER_MAX];
    size_t id_len;
    int64_t allowed_ms; /* when its last line went out */
    int64_t seen_ms;    /* its last event, allowed or not */
    uint64_t held;      /* events since its last line */
} peer_limit_entry;

typedef struct {
    int n;
    peer_limit_entry e[PEER_LIMIT_SLOTS];
} peer_limit;

/* An event from peer id (id_len may be 0: an unknown sender). True if its
 * line may go out now; then *held is how many were held back since the last. */
bool peer_limit_allow(peer_limit *t, const void *id, size_t id_len, int64_t now_ms, uint64_t *held);

/* A peer whose events were held back and whose second is over: copied to
 * *out (with its count) and reset, so the count gets its own line even when
 * the peer sends nothing more. False if there is none. */
bool peer_limit_overdue(peer_limit *t, int64_t now_ms, peer_limit_entry *out);

/* A WARN line about peer id's input, unless peer_limit_allow holds it back;
 * it ends with the count held back since the last. */
void peer_limit_warn(peer_limit *t, const void *id, size_t id_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A WARN line "N more WHAT 'id' held back" for each overdue peer. */
void peer_limit_report(peer_limit *t, const char *what, int64_t now_ms);

#endif
