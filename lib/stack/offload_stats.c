/* The neuron cache's counts (offload_stats.h). */
#include "stack/offload_stats.h"

/* ffn_us before wait_us, layers before tokens, misses before read_ahead: a
 * reader taking them in the other order never sees more waiting than FFN
 * time, more tokens than layers, or more reads asked ahead than reads. */
void offload_counters_add(offload_counters *c, const offload_tally *t) {
    atomic_fetch_add(&c->layers, t->layers);
    atomic_fetch_add(&c->tokens, t->tokens);
    atomic_fetch_add(&c->hot, t->hot);
    atomic_fetch_add(&c->cold_hits, t->cold_hits);
    atomic_fetch_add(&c->misses, t->misses);
    atomic_fetch_add(&c->read_ahead, t->read_ahead);
    atomic_fetch_add(&c->bytes_read, t->bytes_read);
    atomic_fetch_add(&c->ffn_us, t->ffn_us);
    atomic_fetch_add(&c->wait_us, t->wait_us);
}

offload_tally offload_counters_read(const offload_counters *c) {
    offload_tally t;
    t.wait_us = atomic_load(&c->wait_us);
    t.ffn_us = atomic_load(&c->ffn_us);
    t.tokens = atomic_load(&c->tokens);
    t.layers = atomic_load(&c->layers);
    t.hot = atomic_load(&c->hot);
    t.cold_hits = atomic_load(&c->cold_hits);
    t.read_ahead = atomic_load(&c->read_ahead);
    t.misses = atomic_load(&c->misses);
    t.bytes_read = atomic_load(&c->bytes_read);
    return t;
}

static uint64_t minus(uint64_t end, uint64_t start) { return end > start ? end - start : 0; }

offload_tally offload_tally_delta(const offload_tally *end, const offload_tally *start) {
    offload_tally d = {
        .tokens = minus(end->tokens, start->tokens),
        .layers = minus(end->layers, start->layers),
        .hot = minus(end->hot, start->hot),
        .cold_hits = minus(end->cold_hits, start->cold_hits),
        .misses = minus(end->misses, start->misses),
        .read_ahead = minus(end->read_ahead, start->read_ahead),
        .bytes_read = minus(end->bytes_read, start->bytes_read),
        .wait_us = minus(end->wait_us, start->wait_us),
        .ffn_us = minus(end->ffn_us, start->ffn_us),
    };
    if (d.wait_us > d.ffn_us) d.wait_us = d.ffn_us;
    if (d.tokens > d.layers) d.tokens = d.layers;
    if (d.read_ahead > d.misses) d.read_ahead = d.misses;
    return d;
}

static uint64_t most(uint64_t a, uint64_t b) { return a > b ? a : b; }

void offload_tally_merge(offload_tally *into, const offload_tally *t) {
    into->tokens = most(into->tokens, t->tokens);
    into->layers = most(into->layers, t->layers);
    into->hot += t->hot;
    into->cold_hits += t->cold_hits;
    into->misses += t->misses;
    into->read_ahead += t->read_ahead;
    into->bytes_read += t->bytes_read;
    into->wait_us += t->wait_us;
    into->ffn_us += t->ffn_us;
}

static double ratio(double a, uint64_t b) { return b ? a / (double)b : 0; }

offload_rates offload_tally_rates(const offload_tally *t) {
    const uint64_t found = t->hot + t->cold_hits + t->misses;
    return (offload_rates){
        .hot = ratio((double)t->hot, found),
        .cold = ratio((double)t->cold_hits, found),
        .read = ratio((double)t->misses, found),
        .ahead = ratio((double)t->read_ahead, t->misses),
        .bundles_per_token = ratio((double)t->misses, t->tokens),
        .bytes_per_token = ratio((double)t->bytes_read, t->tokens),
        .wait_share = ratio((double)t->wait_us, t->ffn_us),
        .ms_per_layer = ratio(t->ffn_us / 1e3, t->layers),
    };
}
