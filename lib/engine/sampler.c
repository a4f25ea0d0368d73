/* Next-token sampling. Order: top-k cut, temperature softmax, top-p cut, draw.
 * Top-p is applied to the temperature-scaled distribution (the one actually drawn from). */
#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "util/log.h"

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void sampler_init(sampler *s, float temp, int top_k, float top_p, uint64_t seed) {
    s->temp = temp;
    s->top_k = top_k;
    s->top_p = top_p;
    /* spread nearby seeds apart; xorshift must not start at 0 */
    s->rng = splitmix64(seed);
    if (!s->rng) s->rng = 0x2545f4914f6cdd1dull;
    s->s.cap = 0;
    s->s.idx = NULL;
    s->s.prob = NULL;
}

void sampler_free(sampler *s) {
    free(s->s.idx);
    free(s->s.prob);
    s->s.idx = NULL;
    s->s.prob = NULL;
    s->s.cap = 0;
}

/* xorshift64*: uniform double in [0, 1) */
static double next_uniform(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (double)((x * 0x2545f4914f6cdd1dull) >> 11) * 0x1.0p-53;
}

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ---- (value, id) pairs kept in two parallel arrays ---- */

/* a ranks below b: smaller value, or equal value and larger id (lower ids win ties) */
static bool worse(const float *v, const int *id, int a, int b) {
    return v[a] < v[b] || (v[a] == v[b] && id[a] > id[b]);
}

static void swap_pair(float *v, int *id, int a, int b) {
    float tv = v[a];
    v[a] = v[b];
    v[b] = tv;
    int ti = id[a];
    id[a] = id[b];
    id[b] = ti;
}

/* min-heap on rank: the worst pair at the root */
static void sift_down(float *v, int *id, int i, int n) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && worse(v, id, c + 1, c)) c++;
        if (!worse(v, id, c, i)) return;
        swap_pair(v, id, i, c);
        i = c;
    }
}

static void heapify(float *v, int *id, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(v, id, i, n);
}

/* best first */
static void sort_desc(float *v, int *id, int n) {
    heapify(v, id, n);
    for (int end = n - 1; end > 0; end--) {
        swap_pair(v, id, 0, end);
        sift_down(v, id, 0, end);
    }
}

/* The k best logits into (v, id)[0..k), unordered: O(n log k). */
static void select_top_k(const float *logits, int n, int k, float *v, int *id) {
    for (int i = 0; i < k; i++) {
        v[i] = logits[i];
        id[i] = i;
    }
    heapify(v, id, k);
    for (int i = k; i < n; i++) {
        if (logits[i] < v[0] || logits[i] == v[0]) continue; /* i > every id in the heap: loses ties */
        v[0] = logits[i];
        id[0] = i;
        sift_down(v, id, 0, k);
    }
}

static bool reserve(sampler *s, int n) {
    if (s->s.cap >= n) return true;
    int *idx = realloc(s->s.idx, (size_t)n * sizeof *idx);
    if (idx) s->s.idx = idx;
    float *prob = realloc(s->s.prob, (size_t)n * sizeof *prob);
    if (prob) s->s.prob = prob;
    if (!idx || !prob) return false;
    s->s.cap = n;
    return true;
}

/* Keeps the smallest best-first prefix of (p, id)[0..m) whose mass reaches top_p * sum.
 * Returns the new count and sets *sum to the kept mass. */
static int nucleus(float *p, int *id, int m, int n_vocab, float top_p, double *sum) {
    if (m == n_vocab && m > 1) {
        /* Without a top-k cut, sorting 100k+ entries is wasteful: a token whose probability is
         * below (1 - top_p) / (n - 1) can never be inside the nucleus, except the argmax
         * (whose unnormalised p is exactly 1). */
        float cut = (float)((1.0 - top_p) * *sum / (n_vocab - 1));
        if (cut > 1.0f) cut = 1.0f;
        int kept = 0;
        for (int j = 0; j < m; j++)
            if (p[j] >= cut) {
                p[kept] = p[j];
                id[kept] = id[j];
                kept++;
            }
        m = kept;
    }
    sort_desc(p, id, m);
    double target = top_p * *sum, acc = 0;
    int j = 0;
    while (j < m) {
        acc += p[j++];
        if (acc >= target) break;
    }
    *sum = acc;
    return j;
}

int sampler_sample(sampler *s, float *logits, int n) {
    if (n <= 0) return -1;
    if (s->temp <= 0 || s->top_k == 1) return argmax(logits, n);
    if (!reserve(s, n)) {
        log_warn("sampler: out of memory for %d candidates; choosing greedily", n);
        return argmax(logits, n);
    }
    float *p = s->s.prob;
    int *id = s->s.idx;
    int m = n;
    if (s->top_k > 0 && s->top_k < n) {
        m = s->top_k;
        select_top_k(logits, n, m, p, id);
    } else {
        for (int i = 0; i < n; i++) {
            p[i] = logits[i];
            id[i] = i;
        }
    }
    float max = p[0];
    for (int j = 1; j < m; j++)
        if (p[j] > max) max = p[j];
    double sum = 0;
    for (int j = 0; j < m; j++) {
        p[j] = expf((p[j] - max) / s->temp);
        sum += p[j];
    }
    if (!(sum > 0) || !isfinite(sum)) return argmax(logits, n); /* NaN or all -inf logits */
    if (s->top_p < 1.0f) m = nucleus(p, id, m, n, s->top_p, &sum);

    double r = next_uniform(&s->rng) * sum, acc = 0;
    for (int j = 0; j < m; j++) {
        acc += p[j];
        if (r < acc) return id[j];
    }
    return id[m - 1]; /* rounding: r landed at the very top */
}
