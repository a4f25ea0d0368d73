/* lib/stack/cache_sim.c: LRU and the slot table's CLOCK on sequences whose
 * hits are worked out by hand, and the two telling apart where they differ. */
#include <stdlib.h>

#include "stack/cache_sim.h"
#include "test.h"

/* hits of keys[0..n) through a fresh cache of `slots` */
static int hits_of(cache_sim_policy p, uint32_t slots, const uint64_t *keys, int n) {
    cache_sim *s = cache_sim_new(p, slots, 16);
    int hits = 0;
    for (int i = 0; i < n; i++) hits += cache_sim_ref(s, keys[i]);
    cache_sim_free(s);
    return hits;
}

int main(void) {
    CHECK(cache_sim_new(CACHE_SIM_LRU, 0, 4) == NULL, "no slots: refused");
    for (int p = 0; p < 2; p++) {
        const char *name = p ? "CLOCK" : "LRU";
        const cache_sim_policy pol = p ? CACHE_SIM_CLOCK : CACHE_SIM_LRU;
        /* a working set that fits: every lookup after the first pass hits */
        const uint64_t fits[] = {1, 2, 3, 1, 2, 3, 3, 2, 1};
        CHECK(hits_of(pol, 3, fits, 9) == 6, "%s: 3 keys in 3 slots, 6 of 9 hit", name);
        /* one key more than the slots, cyclic: each is evicted just before it comes back */
        const uint64_t cycle[] = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4};
        CHECK(hits_of(pol, 3, cycle, 12) == 0, "%s: 4 keys cycling through 3 slots never hit", name);
    }
    /* A B C A D A: LRU evicts B (least recent) for D, so the last A hits; CLOCK's hand finds every bit
     * set (loads start referenced), clears them all and evicts A, the slot it started at */
    const uint64_t differ[] = {0, 1, 2, 0, 3, 0};
    CHECK(hits_of(CACHE_SIM_LRU, 3, differ, 6) == 2, "LRU: A B C A D A hits A twice");
    CHECK(hits_of(CACHE_SIM_CLOCK, 3, differ, 6) == 1, "CLOCK: A B C A D A hits A once");
    /* CLOCK's second chance: after A B C D (D evicted A, bits of B C cleared, D set), a hit on B sets its bit
     * again, so E evicts C (clear), not B, and B hits again (first in, first out would evict B: 1 hit) */
    const uint64_t chance[] = {0, 1, 2, 3, 1, 4, 1};
    CHECK(hits_of(CACHE_SIM_CLOCK, 3, chance, 7) == 2, "CLOCK: a referenced slot survives the hand once");
    return test_summary();
}
