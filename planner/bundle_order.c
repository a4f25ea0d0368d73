/* Bundles from the model profile (bundle_order.h). */
#include "bundle_order.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "calib/reorder.h"

typedef struct {
    double p;
    long first; /* its first neuron's index in the grouped order */
} bundle_rank;

static int by_need(const void *a, const void *b) {
    const bundle_rank *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->first > y->first) - (x->first < y->first);
}

/* Bit t of a neuron's row is token t: the even tokens choose the groups, the odd ones count how often
 * a group is needed (bundle_order.h) */
#define EVEN_TOKENS 0x5555555555555555ull
#define ODD_TOKENS 0xaaaaaaaaaaaaaaaaull

static const uint64_t *fired_bits(const model_profile *p, int l, int neuron) {
    return p->fired + ((size_t)l * p->n_ff + (size_t)neuron) * (size_t)p->words;
}

/* tokens among `tokens` (a bit mask repeated over every word) on which any of the n neurons fired */
static long union_tokens(const model_profile *p, int l, const int32_t *neurons, int n, uint64_t tokens,
                         uint64_t *scratch) {
    memset(scratch, 0, sizeof(uint64_t) * (size_t)p->words);
    for (int k = 0; k < n; k++) {
        const uint64_t *bits = fired_bits(p, l, neurons[k]);
        for (int w = 0; w < p->words; w++) scratch[w] |= bits[w];
    }
    long c = 0;
    for (int w = 0; w < p->words; w++) c += __builtin_popcountll(scratch[w] & tokens);
    return c;
}

/* even tokens on which neurons i and j both fired */
static uint32_t cofired_even(const model_profile *p, int l, int i, int j) {
    const uint64_t *a = fired_bits(p, l, i), *b = fired_bits(p, l, j);
    uint32_t n = 0;
    for (int w = 0; w < p->words; w++) n += (uint32_t)__builtin_popcountll(a[w] & b[w] & EVEN_TOKENS);
    return n;
}

/* groups of k: each next unassigned neuron in hot order with the k - 1 of the following GROUP_WINDOW
 * unassigned ones that fired with it most often on the even tokens */
static int group_layer(const model_profile *p, int l, const int32_t *hot, int k, int32_t *grouped) {
    const int n = p->n_ff;
    bool *taken = calloc((size_t)n, sizeof *taken);
    if (!taken) return -1;
    long out = 0;
    for (int i = 0; i < n; i++) {
        const int lead = hot[i];
        if (taken[lead]) continue;
        taken[lead] = true;
        grouped[out++] = lead;
        for (int m = 1; m < k; m++) {
            int best = -1;
            uint32_t best_co = 0;
            for (int j = i + 1, seen = 0; j < n && seen < GROUP_WINDOW; j++) {
                if (taken[hot[j]]) continue;
                seen++;
                const uint32_t co = cofired_even(p, l, lead, hot[j]);
                if (best < 0 || co > best_co) best = hot[j], best_co = co;
            }
            if (best < 0) break;
            taken[best] = true;
            grouped[out++] = best;
        }
    }
    free(taken);
    return 0;
}

/* Expected members a token needs that the guess did not name (the model profile's guess_missed). */
static double guess_missed_rate(const model_profile *p, int l, const int32_t *members, int len) {
    double missed = 0;
    for (int i = 0; i < len; i++) missed += p->guess_missed[(size_t)l * (size_t)p->n_ff + (size_t)members[i]];
    return p->n_tokens ? missed / p->n_tokens : 0;
}

/* v[0..n) made non-increasing by pooling adjacent violators (each pool
 * takes its members' mean): the closest such sequence in least squares. */
static void pool_to_descending(double *v, long n, double *sum, long *len) {
    long pools = 0;
    for (long i = 0; i < n; i++) {
        sum[pools] = v[i], len[pools++] = 1;
        while (pools > 1 && sum[pools - 2] * (double)len[pools - 1] < sum[pools - 1] * (double)len[pools - 2]) {
            sum[pools - 2] += sum[pools - 1], len[pools - 2] += len[pools - 1];
            pools--;
        }
    }
    for (long b = 0, i = 0; b < pools; b++)
        for (long j = 0; j < len[b]; j++) v[i++] = sum[b] / (double)len[b];
}

/* How often a token needs the neuron at each place of a layer's hottest-first
 * order, judged on tokens that did not rank it (one neuron a bundle): the
 * neurons ranked by their even tokens, that rank's neurons counted on the odd
 * ones, and the other way round; then made descending (pool_to_descending).
 * Counted on the tokens that ranked them, the first places look hotter than
 * they are (the 7B file at 3 GiB: 97.3 % hits predicted, 96.3 read), as a
 * neuron ranks high partly by chance. need[n_ff]; scratch as union_tokens's;
 * 0, or -1 out of memory. */
static int held_out_needs(const model_profile *p, int l, double *need, uint64_t *scratch) {
    const int n = p->n_ff;
    uint32_t *even = malloc(sizeof(uint32_t) * (size_t)n), *odd = malloc(sizeof(uint32_t) * (size_t)n);
    int32_t *by_even = malloc(sizeof(int32_t) * (size_t)n), *by_odd = malloc(sizeof(int32_t) * (size_t)n);
    double *sum = malloc(sizeof(double) * (size_t)n);
    long *len = malloc(sizeof(long) * (size_t)n);
    int rc = even && odd && by_even && by_odd && sum && len ? 0 : -1;
    for (int32_t i = 0; !rc && i < n; i++) {
        even[i] = (uint32_t)union_tokens(p, l, &i, 1, EVEN_TOKENS, scratch);
        odd[i] = (uint32_t)union_tokens(p, l, &i, 1, ODD_TOKENS, scratch);
    }
    if (!rc && (reorder_layer_perm(even, n, 1, by_even) || reorder_layer_perm(odd, n, 1, by_odd))) rc = -1;
    for (int r = 0; !rc && r < n; r++) need[r] = (double)(odd[by_even[r]] + even[by_odd[r]]) / p->n_tokens;
    if (!rc) pool_to_descending(need, n, sum, len);
    free(even), free(odd), free(by_even), free(by_odd), free(sum), free(len);
    return rc;
}

int bundle_order_make(bundle_order *o, const model_profile *p, int per_bundle, bundle_order_kind kind) {
    const int n = p->n_ff, k = per_bundle;
    memset(o, 0, sizeof *o);
    o->per_bundle = k;
    o->file_order = kind == ORDER_FILE;
    o->n_bundles = (n + k - 1) / k;
    o->n_whole = n / k;
    o->order = malloc(sizeof(int32_t) * (size_t)p->n_layer * (size_t)n);
    o->p_bundle = malloc(sizeof(double) * (size_t)p->n_layer * (size_t)o->n_bundles);
    o->active = malloc(sizeof(double) * (size_t)p->n_layer);
    if (p->guess_missed) o->p_unasked = malloc(sizeof(double) * (size_t)p->n_layer * (size_t)o->n_bundles);
    int32_t *hot = malloc(sizeof(int32_t) * (size_t)n), *grouped = malloc(sizeof(int32_t) * (size_t)n);
    bundle_rank *rank = malloc(sizeof(bundle_rank) * (size_t)o->n_bundles);
    uint64_t *scratch = malloc(sizeof(uint64_t) * (size_t)(p->words ? p->words : 1));
    double *held = malloc(sizeof(double) * (size_t)n);
    bool ok = o->order && o->p_bundle && o->active && (!p->guess_missed || o->p_unasked) && hot && grouped && rank &&
              scratch && held;
    for (int l = 0; ok && l < p->n_layer; l++) {
        const uint32_t *layer_counts = p->counts + (size_t)l * n;
        if (o->file_order) {
            for (int i = 0; i < n; i++) hot[i] = i;
        } else if (reorder_layer_perm(layer_counts, n, 1, hot)) { /* hottest first, ties by index */
            ok = false;
            break;
        }
        double fired = 0;
        for (int i = 0; i < n; i++) fired += layer_counts[i];
        o->active[l] = p->n_tokens ? fired / p->n_tokens : 0;
        if (k == 1 || o->file_order) memcpy(grouped, hot, sizeof(int32_t) * (size_t)n); /* the file's runs of k */
        else if (group_layer(p, l, hot, k, grouped)) {
            ok = false;
            break;
        }
        /* a short last group stays last: only whole groups are sorted */
        const long whole = n / k;
        const uint64_t tokens = k == 1 ? ~0ull : ODD_TOKENS;
        const long counted = k == 1 ? p->n_tokens : p->n_tokens / 2;
        for (long b = 0; b < o->n_bundles; b++) {
            const int len = b < whole ? k : n - (int)(b * k);
            rank[b].first = b * k;
            rank[b].p = counted ? (double)union_tokens(p, l, grouped + b * k, len, tokens, scratch) / counted : 0;
        }
        if (!o->file_order) qsort(rank, (size_t)whole, sizeof *rank, by_need);
        if (k == 1 && !o->file_order && p->n_tokens >= 2) { /* the ranking's own tokens flatter its top */
            if (held_out_needs(p, l, held, scratch)) {
                ok = false;
                break;
            }
            for (long b = 0; b < whole; b++) rank[b].p = held[b];
        }
        int32_t *dst = o->order + (size_t)l * n;
        for (long b = 0; b < o->n_bundles; b++) {
            const int len = b < whole ? k : n - (int)(b * k);
            memcpy(dst + b * k, grouped + rank[b].first, sizeof(int32_t) * (size_t)len);
            o->p_bundle[(size_t)l * o->n_bundles + b] = rank[b].p;
            if (o->p_unasked) /* a member the guess missed: at most the bundle's own need */
                o->p_unasked[(size_t)l * o->n_bundles + b] =
                    fmin(rank[b].p, guess_missed_rate(p, l, dst + b * k, len));
        }
    }
    free(hot), free(grouped), free(rank), free(scratch), free(held);
    if (ok && bundle_order_sort_needs(o, p->n_layer)) ok = false;
    if (!ok) bundle_order_free(o);
    return ok ? 0 : -1;
}

static int by_desc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

int bundle_order_sort_needs(bundle_order *o, int n_layer) {
    const size_t whole = (size_t)o->n_whole, all = (size_t)n_layer * whole;
    free(o->p_desc);
    if (!(o->p_desc = malloc(sizeof(double) * (all ? all : 1)))) return -1;
    for (int l = 0; l < n_layer; l++)
        memcpy(o->p_desc + (size_t)l * whole, o->p_bundle + (size_t)l * (size_t)o->n_bundles, sizeof(double) * whole);
    qsort(o->p_desc, all, sizeof *o->p_desc, by_desc);
    return 0;
}

void bundle_order_free(bundle_order *o) {
    free(o->order), free(o->p_bundle), free(o->active), free(o->p_desc), free(o->p_unasked);
    memset(o, 0, sizeof *o);
}
