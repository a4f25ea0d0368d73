/* The neuron cache's counts under a memory budget (docs/offload.md,
 * "Statistics"). Each cpu-worker adds its counts (cpu-worker/ffn_offload.h)
 * to its row of the control block after every task it runs; `pi2 status`
 * shows them, and the coordinator sends a generation's difference to the
 * client in GenerateDone.
 *
 * Errors: none; a rate with nothing to divide by is 0. */
#ifndef PI2_STACK_OFFLOAD_STATS_H
#define PI2_STACK_OFFLOAD_STATS_H

#include <stdatomic.h>
#include <stdint.h>

/* One snapshot of the counts. */
typedef struct {
    uint64_t tokens, layers;         /* decode steps (layer-0 FFN steps); FFN layer steps */
    uint64_t hot, cold_hits, misses; /* bundles found hot, found in the cold cache, read from storage */
    uint64_t read_ahead;             /* of the misses, those asked for before the layer's attention */
    uint64_t bytes_read;
    uint64_t wait_us, ffn_us;        /* waiting for reads; the whole FFN steps */
} offload_tally;

/* The counts in shared memory: running totals of every process that held
 * the row (a restarted worker adds to its predecessor's). Written and read
 * field by field, in orders that keep wait_us <= ffn_us and tokens <= layers
 * in any one read. */
typedef struct {
    _Atomic uint64_t tokens, layers, hot, cold_hits, misses, read_ahead, bytes_read, wait_us, ffn_us;
} offload_counters;

void offload_counters_add(offload_counters *c, const offload_tally *t);
offload_tally offload_counters_read(const offload_counters *c);

/* end - start, field by field; a field that went down (a read torn by a
 * concurrent add) gives 0, and the result keeps wait_us <= ffn_us,
 * tokens <= layers and read_ahead <= misses. */
offload_tally offload_tally_delta(const offload_tally *end, const offload_tally *start);
/* Adds one worker's tally into a stack's: counts and times summed; tokens
 * and layers the most any worker counted (each takes part in every step). */
void offload_tally_merge(offload_tally *into, const offload_tally *t);

/* What `pi2 status` and the client show; 0 where there is nothing to divide by. */
typedef struct {
    double hot, cold, read;    /* shares of the bundles looked up: found hot, in the cold cache, read */
    double ahead;              /* of the bundles read, the share asked for before the layer's attention */
    double bundles_per_token;  /* read from storage */
    double bytes_per_token;
    double wait_share;         /* of the FFN time, waiting for reads */
    double ms_per_layer;       /* FFN time per layer step (one worker's tally) */
} offload_rates;

offload_rates offload_tally_rates(const offload_tally *t);

#endif
