/* Sampler: greedy, determinism per seed, top-k/top-p cuts, and empirical frequencies against
 * distributions computed here independently (in double, by plain sorting). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "engine/sampler.h"
#include "test.h"

static uint64_t test_rng = 0x9e3779b97f4a7c15ull;

static float rand_logit(void) {
    test_rng ^= test_rng << 13, test_rng ^= test_rng >> 7, test_rng ^= test_rng << 17;
    return (float)((double)(test_rng >> 11) * 0x1.0p-53 * 20.0 - 10.0);
}

static float *random_logits(int n) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++) x[i] = rand_logit();
    return x;
}

static void test_greedy(void) {
    float ties[] = {1, 3, 3, 2};
    CHECK(argmax(ties, 4) == 1, "argmax takes the lowest id on ties");
    sampler s;
    sampler_init(&s, 0.0f, 0, 1.0f, 1);
    CHECK(sampler_sample(&s, ties, 4) == 1, "temp 0 is greedy with lowest id on ties");
    for (int trial = 0; trial < 20; trial++) {
        int n = 1000 + trial;
        float *x = random_logits(n);
        int planted = (trial * 7919) % n;
        x[planted] = 11.0f; /* above every random logit */
        CHECK(sampler_sample(&s, x, n) == planted, "greedy picks the maximum");
        free(x);
    }
    sampler_free(&s);
}

static void draw(float temp, int top_k, float top_p, uint64_t seed, const float *logits, int n, int *out,
                 int count) {
    sampler s;
    sampler_init(&s, temp, top_k, top_p, seed);
    float *copy = malloc((size_t)n * sizeof *copy);
    for (int i = 0; i < count; i++) {
        memcpy(copy, logits, (size_t)n * sizeof *copy);
        out[i] = sampler_sample(&s, copy, n);
    }
    free(copy);
    sampler_free(&s);
}

static void test_seeds(void) {
    enum { N = 1000, DRAWS = 200 };
    float *x = random_logits(N);
    for (int i = 0; i < N; i++) x[i] *= 0.3f; /* flat enough that draws vary */
    int a[DRAWS], b[DRAWS], c[DRAWS];
    draw(1.0f, 0, 1.0f, 42, x, N, a, DRAWS);
    draw(1.0f, 0, 1.0f, 42, x, N, b, DRAWS);
    draw(1.0f, 0, 1.0f, 43, x, N, c, DRAWS);
    CHECK(!memcmp(a, b, sizeof a), "the same seed gives the same sequence");
    CHECK(memcmp(a, c, sizeof a), "different seeds give different sequences");
    int distinct = 0;
    for (int i = 1; i < DRAWS; i++) distinct += a[i] != a[0];
    CHECK(distinct > 0, "draws at temp 1 vary");
    free(x);
}

static void test_degenerate_cuts(void) {
    float temps[] = {0.3f, 1.0f, 5.0f, 100.0f};
    for (int trial = 0; trial < 10; trial++) {
        int n = 5000;
        float *x = random_logits(n);
        int best = argmax(x, n);
        for (int t = 0; t < 4; t++) {
            int got[50];
            draw(temps[t], 1, 1.0f, (uint64_t)trial, x, n, got, 50);
            int all = 1;
            for (int i = 0; i < 50; i++) all &= got[i] == best;
            CHECK(all, "top_k = 1 is greedy at temp %g", temps[t]);
            draw(temps[t], 0, 1e-6f, (uint64_t)trial, x, n, got, 50);
            all = 1;
            for (int i = 0; i < 50; i++) all &= got[i] == best;
            CHECK(all, "top_p = 1e-6 is greedy at temp %g", temps[t]);
            draw(temps[t], 50, 1e-6f, (uint64_t)trial, x, n, got, 50);
            all = 1;
            for (int i = 0; i < 50; i++) all &= got[i] == best;
            CHECK(all, "top_k = 50 with top_p = 1e-6 is greedy at temp %g", temps[t]);
        }
        free(x);
    }
    float flat[6] = {0, 0, 0, 0, 0, 0};
    int got[300], inside = 1;
    draw(1.0f, 3, 1.0f, 5, flat, 6, got, 300);
    for (int i = 0; i < 300; i++) inside &= got[i] >= 0 && got[i] < 3;
    CHECK(inside, "top-k breaks ties toward lower ids");
    draw(1.0f, 0, 0.3f, 5, flat, 6, got, 300); /* 1/6 each: the nucleus is two tokens */
    inside = 1;
    for (int i = 0; i < 300; i++) inside &= got[i] >= 0 && got[i] < 2;
    CHECK(inside, "top-p breaks ties toward lower ids");
    draw(1.0f, 4, 0.4f, 5, flat, 6, got, 300); /* 1/4 each after top-k: two tokens again */
    inside = 1;
    for (int i = 0; i < 300; i++) inside &= got[i] >= 0 && got[i] < 2;
    CHECK(inside, "top-k then top-p break ties toward lower ids");
}

/* The distribution the sampler should draw from, worked out directly in double. */
static void expected_probs(const float *logits, int n, double temp, int top_k, double top_p, double *p) {
    int order[64];
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 0; i < n; i++) /* selection sort, best first, lower id first on ties */
        for (int j = i + 1; j < n; j++)
            if (logits[order[j]] > logits[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int k = top_k > 0 && top_k < n ? top_k : n;
    double sum = 0;
    for (int i = 0; i < n; i++) p[i] = 0;
    for (int r = 0; r < k; r++) sum += p[order[r]] = exp(((double)logits[order[r]] - logits[order[0]]) / temp);
    if (top_p < 1) {
        double acc = 0;
        int keep = 0;
        while (keep < k && acc < top_p * sum) acc += p[order[keep++]];
        for (int r = keep; r < k; r++) p[order[r]] = 0;
        sum = acc;
    }
    for (int i = 0; i < n; i++) p[i] /= sum;
}

/* chi-square quantile for a tail of about 1e-6 (Wilson-Hilferty, z = 4.75) */
static double chi2_limit(int df) {
    double a = 2.0 / (9.0 * df);
    return df * pow(1.0 - a + 4.75 * sqrt(a), 3.0);
}

static void test_frequencies(float temp, int top_k, float top_p) {
    enum { N = 8, DRAWS = 200000 };
    const float logits[N] = {0.0f, 0.5f, 1.0f, 1.5f, -1.0f, 2.0f, 0.3f, -0.5f};
    double p[N];
    expected_probs(logits, N, temp, top_k, top_p, p);
    int *got = malloc(DRAWS * sizeof *got);
    draw(temp, top_k, top_p, 12345, logits, N, got, DRAWS);
    long count[N] = {0};
    int outside = 0;
    for (int i = 0; i < DRAWS; i++) {
        if (got[i] < 0 || got[i] >= N || p[got[i]] == 0) outside++;
        else count[got[i]]++;
    }
    double chi2 = 0;
    int bins = 0;
    for (int i = 0; i < N; i++)
        if (p[i] > 0) {
            double e = p[i] * DRAWS;
            chi2 += (count[i] - e) * (count[i] - e) / e;
            bins++;
        }
    CHECK(outside == 0, "temp %g top_k %d top_p %g: %d draws outside the allowed set", temp, top_k, top_p, outside);
    CHECK(bins < 2 || chi2 < chi2_limit(bins - 1), "temp %g top_k %d top_p %g: chi2 %.1f over %d bins, limit %.1f",
          temp, top_k, top_p, chi2, bins, chi2_limit(bins - 1));
    free(got);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Vocabulary-sized cuts: every draw inside the k largest / the nucleus computed here. */
static void test_large_vocab(void) {
    enum { N = 150000, K = 40, DRAWS = 500 };
    float *x = random_logits(N);
    float *sorted = malloc(N * sizeof *sorted);
    memcpy(sorted, x, N * sizeof *sorted);
    qsort(sorted, N, sizeof *sorted, cmp_desc);
    int got[DRAWS];
    double t0 = clock_seconds();
    draw(1.5f, K, 1.0f, 9, x, N, got, DRAWS);
    double t_k = (clock_seconds() - t0) / DRAWS;
    int outside = 0;
    for (int i = 0; i < DRAWS; i++) outside += got[i] < 0 || x[got[i]] < sorted[K - 1];
    CHECK(outside == 0, "top-k %d over %d: %d draws outside the k largest", K, N, outside);

    /* nucleus 0.9 at temp 0.5: the smallest prefix of the sorted softmax reaching 0.9 */
    double sum = 0, acc = 0;
    for (int i = 0; i < N; i++) sum += exp(((double)sorted[i] - sorted[0]) / 0.5);
    int keep = 0;
    while (keep < N && acc < 0.9 * sum) acc += exp(((double)sorted[keep++] - sorted[0]) / 0.5);
    t0 = clock_seconds();
    draw(0.5f, 0, 0.9f, 9, x, N, got, DRAWS);
    double t_p = (clock_seconds() - t0) / DRAWS;
    outside = 0;
    int distinct = 0;
    for (int i = 0; i < DRAWS; i++) {
        outside += got[i] < 0 || x[got[i]] < sorted[keep - 1];
        distinct += got[i] != got[0];
    }
    CHECK(outside == 0, "top-p 0.9 over %d (nucleus %d): %d draws outside", N, keep, outside);
    CHECK(keep == 1 || distinct > 0, "top-p draws vary inside a nucleus of %d", keep);
    printf("n=%d: top-k %d sample %.3f ms, top-p 0.9 sample %.3f ms (nucleus %d)\n", N, K, 1e3 * t_k, 1e3 * t_p,
           keep);
    free(sorted);
    free(x);
}

int main(void) {
    test_greedy();
    test_seeds();
    test_degenerate_cuts();
    test_frequencies(1.0f, 0, 1.0f);
    test_frequencies(2.0f, 0, 1.0f);
    test_frequencies(0.7f, 0, 1.0f);
    test_frequencies(1.0f, 3, 1.0f);
    test_frequencies(1.0f, 0, 0.8f);
    test_frequencies(1.3f, 5, 0.6f);
    test_large_vocab();
    return test_summary();
}
