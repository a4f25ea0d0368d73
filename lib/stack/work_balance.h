/* Where the decode work split's cuts (stack.h, work_share) fall. Even by
 * default; with balancing on, moved after every token so that the workers
 * take the same time, from how long each was busy (its step time without
 * the barrier waits). A worker on a slower core, or one whose core also runs
 * the io-worker and the coordinator, then gets less of every dimension
 * (heads, rows, neurons, vocabulary) and the others stop waiting for it at
 * every barrier. The cuts never change a result (work_share), only who
 * computes it.
 *
 * Errors: work_balance_parse returns -1 with a message in err, and
 * work_balance_describe -1 when no split was published; the rest cannot
 * fail. */
#ifndef PI2_WORK_BALANCE_H
#define PI2_WORK_BALANCE_H

#include <stdbool.h>
#include <stdint.h>

#include "stack/stack.h"

/* How far one token's measurement moves the split towards the one it
 * implies: half-way damps a noisy token and still settles in a few tokens. */
#define WORK_BALANCE_GAIN 0.5
/* No worker's share falls under this part of an even share: a core slowed
 * for a moment (a neighbour, a page fault) keeps enough work to be measured
 * and to get its share back. */
#define WORK_BALANCE_MIN_OF_EVEN 0.25

typedef struct {
    int n;                                  /* workers */
    bool adaptive;                          /* moved by work_balance_update; else fixed */
    double share[STACK_MAX_CPU_WORKERS];    /* each worker's part, summing to 1 */
    uint32_t cut[STACK_MAX_CPU_WORKERS + 1];/* worker i: [cut[i], cut[i + 1]), cut[0] = 0, cut[n] = ONE */
} work_balance;

/* Parses a split as written in a stack config or on the coordinator's command
 * line: "auto" (balanced, starting even), "even" (fixed), or n positive
 * weights "W0,W1,..." (fixed, worker i gets Wi / sum). 0, or -1 with err. */
int work_balance_parse(work_balance *b, const char *spec, int n_workers, char *err, size_t errlen);

/* One decode token's busy time of each worker (nanoseconds); a worker with
 * none (restarted, or the step re-sent) leaves the split as it is. */
void work_balance_update(work_balance *b, const uint64_t *busy_ns);

/* Writes b's cuts into the control block, where work_balance_describe reads them. */
void work_balance_publish(const work_balance *b, stack_ctl *ctl);
/* "decode split (balanced): cpu-worker.0 47.0 %, cpu-worker.1 53.0 %" as last published; 0, or -1 when
 * none was (or a read fell between two updates). */
int work_balance_describe(const stack_ctl *ctl, char *buf, size_t len);

#endif
