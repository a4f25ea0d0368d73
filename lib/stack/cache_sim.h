/* Replacement policies of the neuron cache's cold slots, simulated over a
 * trace of lookups (tools/cache-sim, PI2_BUNDLE_TRACE): which of LRU and
 * CLOCK keeps more of what the cpu-workers look up again (docs/offload.md).
 * CLOCK is the slot table's own (stack/neuron_cache.c): a hit sets the
 * slot's reference bit, the hand clears set bits and takes the first clear
 * slot, and a loaded bundle starts referenced (its worker pins it as soon as
 * it lands). Keys are dense: 0 .. n_keys-1.
 *
 * Errors: cache_sim_new returns NULL when out of memory or slots is 0;
 * cache_sim_ref cannot fail and trusts key < n_keys. */
#ifndef PI2_CACHE_SIM_H
#define PI2_CACHE_SIM_H

#include <stdbool.h>
#include <stdint.h>

/* The trace format (PI2_BUNDLE_TRACE, cpu-worker/ffn_offload.c): pairs of
 * uint32 (layer, bundle), each layer step ended by (CACHE_TRACE_STEP_END, 0). */
#define CACHE_TRACE_STEP_END 0xffffffffu

typedef enum { CACHE_SIM_LRU, CACHE_SIM_CLOCK } cache_sim_policy;

typedef struct cache_sim cache_sim;

/* NULL when out of memory or slots is 0. */
cache_sim *cache_sim_new(cache_sim_policy policy, uint32_t slots, uint64_t n_keys);
void cache_sim_free(cache_sim *s);
/* One lookup of key (< n_keys): true on a hit; a miss loads it, evicting by the policy. */
bool cache_sim_ref(cache_sim *s, uint64_t key);

#endif
