/* Cold-slot replacement policies, simulated (cache_sim.h). */
#include "stack/cache_sim.h"

#include <stdlib.h>

#define NONE UINT32_MAX

struct cache_sim {
    cache_sim_policy policy;
    uint32_t slots, used;
    uint32_t *slot_of;  /* [n_keys]: NONE, or the key's slot */
    uint64_t *key_of;   /* [slots] */
    /* LRU: slots in a list, most recent at head */
    uint32_t *prev, *next, head, tail;
    /* CLOCK */
    uint8_t *referenced;
    uint32_t hand;
};

void cache_sim_free(cache_sim *s) {
    if (!s) return;
    free(s->slot_of); free(s->key_of); free(s->prev); free(s->next); free(s->referenced);
    free(s);
}

cache_sim *cache_sim_new(cache_sim_policy policy, uint32_t slots, uint64_t n_keys) {
    cache_sim *s = calloc(1, sizeof *s);
    if (!s || !slots) { free(s); return NULL; }
    s->policy = policy;
    s->slots = slots;
    s->head = s->tail = NONE;
    s->slot_of = malloc(sizeof *s->slot_of * n_keys);
    s->key_of = malloc(sizeof *s->key_of * slots);
    s->prev = malloc(sizeof *s->prev * slots);
    s->next = malloc(sizeof *s->next * slots);
    s->referenced = calloc(slots, 1);
    if (!s->slot_of || !s->key_of || !s->prev || !s->next || !s->referenced) {
        cache_sim_free(s);
        return NULL;
    }
    for (uint64_t k = 0; k < n_keys; k++) s->slot_of[k] = NONE;
    return s;
}

static void unlink_slot(cache_sim *s, uint32_t i) {
    if (s->prev[i] != NONE) s->next[s->prev[i]] = s->next[i];
    else s->head = s->next[i];
    if (s->next[i] != NONE) s->prev[s->next[i]] = s->prev[i];
    else s->tail = s->prev[i];
}

static void push_front(cache_sim *s, uint32_t i) {
    s->prev[i] = NONE;
    s->next[i] = s->head;
    if (s->head != NONE) s->prev[s->head] = i;
    s->head = i;
    if (s->tail == NONE) s->tail = i;
}

/* the slot a miss takes: a free one while there are, else the policy's victim */
static uint32_t victim(cache_sim *s) {
    if (s->used < s->slots) return s->used++;
    if (s->policy == CACHE_SIM_LRU) return s->tail;
    for (;;) {
        const uint32_t i = s->hand;
        s->hand = (s->hand + 1) % s->slots;
        if (!s->referenced[i]) return i;
        s->referenced[i] = 0;
    }
}

bool cache_sim_ref(cache_sim *s, uint64_t key) {
    uint32_t i = s->slot_of[key];
    const bool hit = i != NONE;
    if (!hit) {
        const bool fresh = s->used < s->slots;
        i = victim(s);
        if (!fresh) s->slot_of[s->key_of[i]] = NONE;
        if (!fresh && s->policy == CACHE_SIM_LRU) unlink_slot(s, i);
        s->key_of[i] = key;
        s->slot_of[key] = i;
    } else if (s->policy == CACHE_SIM_LRU) {
        unlink_slot(s, i);
    }
    if (s->policy == CACHE_SIM_LRU) push_front(s, i);
    else s->referenced[i] = 1;
    return hit;
}
