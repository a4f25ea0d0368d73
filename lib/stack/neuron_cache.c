/* The neuron cache's slot table (neuron_cache.h). */
#include "stack/neuron_cache.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "util/pi2_assert.h"

enum { EMPTY = 0, LOADING = 1, READY = 2 };

/* make asan: a slot number handed back by a caller is one of the table's */
#define DEBUG_ASSERT_SLOT(c, slot)                                                                              \
    PI2_DEBUG_ASSERT((slot) >= 0 && (slot) < (int64_t)(c)->shape.n_slots, "slot %lld of %llu", (long long)(slot), \
                     (unsigned long long)(c)->shape.n_slots)

#define PIN_BITS 30
#define PIN_MASK ((1ull << PIN_BITS) - 1)
#define STATE_SHIFT PIN_BITS
#define GEN_SHIFT 32
#define NO_KEY UINT64_MAX

static uint64_t word_of(uint32_t gen, unsigned state, uint64_t pins) {
    return (uint64_t)gen << GEN_SHIFT | (uint64_t)state << STATE_SHIFT | pins;
}
static uint32_t gen_of(uint64_t w) { return (uint32_t)(w >> GEN_SHIFT); }
static unsigned state_of(uint64_t w) { return (unsigned)(w >> STATE_SHIFT) & 3u; }
static uint64_t pins_of(uint64_t w) { return w & PIN_MASK; }

typedef struct {
    _Atomic uint64_t word;
    _Atomic uint64_t key;        /* layer << 48 | expert << 32 | bundle, or NO_KEY */
    _Atomic uint32_t referenced; /* CLOCK's second chance */
    uint8_t pad[44];             /* one cache line per slot: readers of different slots do not share lines */
} slot_meta;

typedef struct {
    _Atomic uint64_t magic; /* stored last (release): a table is usable once it has it */
    ncache_shape shape;
    _Atomic uint64_t hand; /* CLOCK's position (the writer's) */
    _Atomic uint64_t hits, misses, loads, evictions;
    uint8_t pad[56]; /* to two cache lines */
} table_header;

struct ncache {
    table_header *h;
    ncache_shape shape; /* validated once; the shared copy is not read again */
    slot_meta *slots;
    _Atomic int32_t *index;
    uint8_t *data;
};

_Static_assert(sizeof(slot_meta) == 64, "a slot's metadata is one cache line");
_Static_assert(sizeof(table_header) % 64 == 0, "slots start on a cache line");

static bool shape_ok(const ncache_shape *s) {
    return s->n_layer >= 1 && s->n_layer <= NCACHE_MAX_LAYERS && s->n_expert >= 1 &&
           s->n_expert <= NCACHE_MAX_EXPERTS && s->n_bundles >= 1 && s->n_bundles <= NCACHE_MAX_BUNDLES &&
           s->n_slots >= 1 && s->n_slots <= NCACHE_MAX_SLOTS && s->slot_bytes >= 4096 && s->slot_bytes % 4096 == 0 &&
           s->slot_bytes <= (64u << 20);
}

static uint64_t index_entries(const ncache_shape *s) {
    return (uint64_t)s->n_layer * s->n_expert * s->n_bundles;
}

size_t ncache_table_bytes(const ncache_shape *s) {
    if (!shape_ok(s)) return 0;
    return sizeof(table_header) + sizeof(slot_meta) * (size_t)s->n_slots + sizeof(int32_t) * index_entries(s);
}

static uint64_t key_of(uint32_t layer, uint32_t expert, uint32_t bundle) {
    return (uint64_t)layer << 48 | (uint64_t)expert << 32 | bundle;
}

static uint64_t index_of(const ncache_shape *s, uint64_t key) {
    const uint64_t layer = key >> 48, expert = (key >> 32) & 0xffff, bundle = key & 0xffffffffu;
    return (layer * s->n_expert + expert) * s->n_bundles + bundle;
}

static bool key_in_shape(const ncache_shape *s, uint64_t key) {
    return (key >> 48) < s->n_layer && ((key >> 32) & 0xffff) < s->n_expert && (key & 0xffffffffu) < s->n_bundles;
}

static ncache *handle(void *table, uint8_t *data, const ncache_shape *s) {
    ncache *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->h = table;
    c->shape = *s;
    c->slots = (slot_meta *)((uint8_t *)table + sizeof(table_header));
    c->index = (_Atomic int32_t *)(c->slots + s->n_slots);
    c->data = data;
    return c;
}

static int check_sizes(const ncache_shape *s, size_t table_bytes, size_t data_bytes, char *err, size_t errlen) {
    const size_t need = ncache_table_bytes(s);
    if (!need) {
        err_set(err, errlen, "neuron cache: shape %u layers x %u experts x %u bundles, %u slots of %llu bytes is out of range",
                s->n_layer, s->n_expert, s->n_bundles, s->n_slots, (unsigned long long)s->slot_bytes);
        return -1;
    }
    if (table_bytes < need || data_bytes / s->slot_bytes < s->n_slots) {
        err_set(err, errlen, "neuron cache: table of %zu bytes (needs %zu), data of %zu bytes (needs %u x %llu)",
                table_bytes, need, data_bytes, s->n_slots, (unsigned long long)s->slot_bytes);
        return -1;
    }
    return 0;
}

ncache *ncache_create(void *table, size_t table_bytes, uint8_t *data, size_t data_bytes, const ncache_shape *s,
                      char *err, size_t errlen) {
    if (check_sizes(s, table_bytes, data_bytes, err, errlen)) return NULL;
    table_header *h = table;
    memset(h, 0, sizeof *h);
    h->shape = *s;
    ncache *c = handle(table, data, s);
    if (!c) {
        err_set(err, errlen, "neuron cache: out of memory");
        return NULL;
    }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        atomic_init(&c->slots[i].word, word_of(0, EMPTY, 0));
        atomic_init(&c->slots[i].key, NO_KEY);
        atomic_init(&c->slots[i].referenced, 0);
    }
    for (uint64_t i = 0; i < index_entries(s); i++) atomic_init(&c->index[i], -1);
    atomic_store_explicit(&h->magic, NCACHE_MAGIC, memory_order_release);
    return c;
}

ncache *ncache_attach(void *table, size_t table_bytes, uint8_t *data, size_t data_bytes, char *err, size_t errlen) {
    table_header *h = table;
    if (table_bytes < sizeof *h || atomic_load_explicit(&h->magic, memory_order_acquire) != NCACHE_MAGIC) {
        err_set(err, errlen, "neuron cache: no table here (magic)");
        return NULL;
    }
    const ncache_shape s = h->shape;
    if (check_sizes(&s, table_bytes, data_bytes, err, errlen)) return NULL;
    ncache *c = handle(table, data, &s);
    if (!c) {
        err_set(err, errlen, "neuron cache: out of memory");
        return NULL;
    }
    for (uint64_t i = 0; i < index_entries(&s); i++) {
        const int32_t v = atomic_load_explicit(&c->index[i], memory_order_relaxed);
        if (v < -1 || v >= (int64_t)s.n_slots) {
            err_set(err, errlen, "neuron cache: index entry %llu names slot %d of %u", (unsigned long long)i, v,
                    s.n_slots);
            free(c);
            return NULL;
        }
    }
    for (uint32_t i = 0; i < s.n_slots; i++) {
        const uint64_t key = atomic_load_explicit(&c->slots[i].key, memory_order_relaxed);
        const uint64_t w = atomic_load_explicit(&c->slots[i].word, memory_order_relaxed);
        if ((key != NO_KEY && !key_in_shape(&s, key)) || state_of(w) > READY) {
            err_set(err, errlen, "neuron cache: slot %u has a key or state outside the table's shape", i);
            free(c);
            return NULL;
        }
    }
    return c;
}

void ncache_detach(ncache *c) { free(c); }

const ncache_shape *ncache_shape_of(const ncache *c) { return &c->shape; }

static uint8_t *slot_data(const ncache *c, uint64_t slot) { return c->data + slot * c->shape.slot_bytes; }

const uint8_t *ncache_pin(ncache *c, uint32_t layer, uint32_t expert, uint32_t bundle, ncache_ref *ref) {
    const ncache_shape *s = &c->shape;
    ref->slot = -1;
    if (layer >= s->n_layer || expert >= s->n_expert || bundle >= s->n_bundles) return NULL;
    const uint64_t key = key_of(layer, expert, bundle);
    /* acquire: pairs with ncache_publish's release of the index entry. The entry is another process's
     * word: a slot number outside the table is no slot. */
    const int32_t slot = atomic_load_explicit(&c->index[index_of(s, key)], memory_order_acquire);
    if (slot >= 0 && (uint32_t)slot < s->n_slots) {
        slot_meta *m = &c->slots[slot];
        uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
        while (state_of(w) == READY && pins_of(w) < PIN_MASK) {
            /* acq_rel: acquire the bundle's bytes that publish released with READY; release the pin to
             * claim's acquire load, which then leaves the slot alone */
            if (atomic_compare_exchange_weak_explicit(&m->word, &w, w + 1, memory_order_acq_rel,
                                                      memory_order_acquire)) {
                /* claim writes a new key only after winning the word with no pins: the key seen after
                 * our pin is the bundle the slot holds */
                if (atomic_load_explicit(&m->key, memory_order_acquire) == key) {
                    atomic_store_explicit(&m->referenced, 1, memory_order_relaxed);
                    atomic_fetch_add_explicit(&c->h->hits, 1, memory_order_relaxed);
                    ref->slot = slot;
                    return slot_data(c, (uint64_t)slot);
                }
                atomic_fetch_sub_explicit(&m->word, 1, memory_order_release); /* reused for another bundle */
                break;
            }
        }
    }
    atomic_fetch_add_explicit(&c->h->misses, 1, memory_order_relaxed);
    return NULL;
}

bool ncache_contains(const ncache *c, uint32_t layer, uint32_t expert, uint32_t bundle) {
    const ncache_shape *s = &c->shape;
    if (layer >= s->n_layer || expert >= s->n_expert || bundle >= s->n_bundles) return false;
    const uint64_t key = key_of(layer, expert, bundle);
    const int32_t slot = atomic_load_explicit(&c->index[index_of(s, key)], memory_order_acquire);
    return slot >= 0 && (uint32_t)slot < s->n_slots &&
           atomic_load_explicit(&c->slots[slot].key, memory_order_acquire) == key &&
           state_of(atomic_load_explicit(&c->slots[slot].word, memory_order_acquire)) == READY;
}

void ncache_unpin(ncache *c, const ncache_ref *ref) {
    if (ref->slot >= 0) DEBUG_ASSERT_SLOT(c, ref->slot);
    /* release: this reader's loads of the slot's bytes are done before claim's acquire sees the pin go */
    if (ref->slot >= 0) atomic_fetch_sub_explicit(&c->slots[ref->slot].word, 1, memory_order_release);
}

int64_t ncache_claim(ncache *c, uint32_t layer, uint32_t expert, uint32_t bundle, uint8_t **dest) {
    const ncache_shape *s = &c->shape;
    if (layer >= s->n_layer || expert >= s->n_expert || bundle >= s->n_bundles) return -1;
    const uint64_t key = key_of(layer, expert, bundle);
    if (atomic_load_explicit(&c->index[index_of(s, key)], memory_order_relaxed) >= 0) return -1;
    /* two sweeps: the first may only clear reference bits */
    for (uint64_t step = 0; step < 2ull * s->n_slots + 1; step++) {
        const uint64_t i = atomic_fetch_add_explicit(&c->h->hand, 1, memory_order_relaxed) % s->n_slots;
        slot_meta *m = &c->slots[i];
        uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
        if (pins_of(w) || state_of(w) == LOADING) continue;
        if (atomic_exchange_explicit(&m->referenced, 0, memory_order_relaxed)) continue;
        /* acq_rel: acquire every unpin's release (no reader is still in the bytes we are about to
         * overwrite); the new generation tells a reader that held the old one that the slot moved on */
        if (!atomic_compare_exchange_strong_explicit(&m->word, &w, word_of(gen_of(w) + 1, LOADING, 0),
                                                     memory_order_acq_rel, memory_order_acquire))
            continue; /* pinned meanwhile */
        const uint64_t old = atomic_load_explicit(&m->key, memory_order_relaxed);
        if (old != NO_KEY) {
            int32_t expected = (int32_t)i;
            atomic_compare_exchange_strong_explicit(&c->index[index_of(s, old)], &expected, -1,
                                                    memory_order_release, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->h->evictions, 1, memory_order_relaxed);
        }
        atomic_store_explicit(&m->key, key, memory_order_relaxed);
        *dest = slot_data(c, i);
        return (int64_t)i;
    }
    return -1;
}

void ncache_publish(ncache *c, int64_t slot) {
    DEBUG_ASSERT_SLOT(c, slot);
    slot_meta *m = &c->slots[slot];
    const uint64_t w = atomic_load_explicit(&m->word, memory_order_relaxed);
    if (state_of(w) != LOADING) { /* not claimed: publishing would zero live pins */
        log_error("neuron cache: slot %lld published while not loading", (long long)slot);
        return;
    }
    /* release: the bundle's bytes (read into the slot before this call) and the key claim stored go
     * with READY to pin's acquire; then the index entry, released likewise, makes the slot findable */
    atomic_store_explicit(&m->word, word_of(gen_of(w), READY, 0), memory_order_release);
    const uint64_t key = atomic_load_explicit(&m->key, memory_order_relaxed);
    atomic_store_explicit(&c->index[index_of(&c->shape, key)], (int32_t)slot, memory_order_release);
    atomic_fetch_add_explicit(&c->h->loads, 1, memory_order_relaxed);
}

void ncache_abandon(ncache *c, int64_t slot) {
    DEBUG_ASSERT_SLOT(c, slot);
    slot_meta *m = &c->slots[slot];
    const uint64_t w = atomic_load_explicit(&m->word, memory_order_relaxed);
    if (state_of(w) != LOADING) {
        log_error("neuron cache: slot %lld abandoned while not loading", (long long)slot);
        return;
    }
    atomic_store_explicit(&m->key, NO_KEY, memory_order_relaxed);
    atomic_store_explicit(&m->word, word_of(gen_of(w), EMPTY, 0), memory_order_release);
}

void ncache_writer_restart(ncache *c) {
    const ncache_shape *s = &c->shape;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        slot_meta *m = &c->slots[i];
        const uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
        const uint64_t key = atomic_load_explicit(&m->key, memory_order_relaxed);
        if (state_of(w) == LOADING) {
            ncache_abandon(c, i);
        } else if (state_of(w) == READY && key != NO_KEY && key_in_shape(s, key)) {
            int32_t none = -1; /* published but not indexed yet when the writer died */
            atomic_compare_exchange_strong_explicit(&c->index[index_of(s, key)], &none, (int32_t)i,
                                                    memory_order_release, memory_order_relaxed);
        }
    }
}

void ncache_get_stats(const ncache *c, ncache_stats *out) {
    table_header *h = c->h;
    out->hits = atomic_load_explicit(&h->hits, memory_order_relaxed);
    out->misses = atomic_load_explicit(&h->misses, memory_order_relaxed);
    out->loads = atomic_load_explicit(&h->loads, memory_order_relaxed);
    out->evictions = atomic_load_explicit(&h->evictions, memory_order_relaxed);
}

void ncache_census(const ncache *c, uint32_t *pinned, uint32_t *loading) {
    *pinned = *loading = 0;
    for (uint32_t i = 0; i < c->shape.n_slots; i++) {
        const uint64_t w = atomic_load_explicit(&c->slots[i].word, memory_order_relaxed);
        *pinned += pins_of(w) != 0;
        *loading += state_of(w) == LOADING;
    }
}
