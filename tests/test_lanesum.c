/* The bundle checksum (lib/kernels/lanesum.h): the reference follows its
 * definition (one and two stripes summed here by hand); it notices what a
 * bad read does to a bundle (any one bit flipped, two stripes swapped, a
 * short read's stale half, a byte more or less); every kernel set's version
 * gives the reference's bits at every length and alignment; and a bundle file
 * is summed with it whichever set runs. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/lanesum.h"
#include "plan/bundle.h"
#include "util/checksum.h"
#include "util/synth_rng.h"
#include "test.h"

#define MAX_N (3 * 4096 + 77)
#define MAX_SHIFT 9

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    synth_rng rng = synth_stream(seed, 0);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)synth_next(&rng);
}

static uint64_t word(const uint8_t *p) {
    uint64_t w = 0;
    for (int b = 7; b >= 0; b--) w = w << 8 | p[b];
    return w;
}

/* lanesum.h's formula, stripe by stripe, for n bytes */
static uint64_t by_definition(const uint8_t *p, size_t n) {
    uint64_t acc[LANESUM_LANES];
    const uint64_t stripes = n / LANESUM_STRIPE;
    for (int k = 0; k < LANESUM_LANES; k++) {
        acc[k] = LANESUM_SEED[k];
        for (uint64_t s = 0; s < stripes; s++) {
            const uint64_t w = word(p + s * LANESUM_STRIPE + 8 * (uint64_t)k);
            const uint64_t x = w ^ (LANESUM_KEY[k] + s * LANESUM_STEP);
            acc[k] += (uint64_t)(uint32_t)x * (uint64_t)(uint32_t)(x >> 32) + w;
        }
    }
    uint64_t h = 0;
    for (int k = 0; k < LANESUM_LANES; k++) h = checksum_mix(h, acc[k]);
    for (size_t i = stripes * LANESUM_STRIPE; i < n; i++) h = checksum_mix(h, p[i]);
    return checksum_mix(h, n);
}

static void test_definition(const uint8_t *buf) {
    static const size_t lengths[] = {0, 1, 63, 64, 65, 127, 128, 200, 4096};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
        CHECK(lanesum64_scalar(buf, lengths[i]) == by_definition(buf, lengths[i]), "n=%zu: not the formula's value",
              lengths[i]);
}

/* what a bad read does to an 8 KiB bundle */
static void test_detects(uint8_t *buf) {
    enum { N = 8192 };
    const uint64_t good = lanesum64_scalar(buf, N);
    int missed = 0;
    for (size_t bit = 0; bit < 8 * (size_t)N; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << bit % 8);
        missed += lanesum64_scalar(buf, N) == good;
        buf[bit / 8] ^= (uint8_t)(1u << bit % 8);
    }
    CHECK(missed == 0, "%d of %d single-bit flips give the same sum", missed, 8 * N);
    missed = 0;
    uint8_t tmp[LANESUM_STRIPE];
    for (size_t a = 0; a < N / LANESUM_STRIPE; a += 3)
        for (size_t b = a + 1; b < N / LANESUM_STRIPE; b += 5) {
            memcpy(tmp, buf + a * LANESUM_STRIPE, LANESUM_STRIPE);
            memcpy(buf + a * LANESUM_STRIPE, buf + b * LANESUM_STRIPE, LANESUM_STRIPE);
            memcpy(buf + b * LANESUM_STRIPE, tmp, LANESUM_STRIPE);
            missed += lanesum64_scalar(buf, N) == good;
            memcpy(buf + b * LANESUM_STRIPE, buf + a * LANESUM_STRIPE, LANESUM_STRIPE);
            memcpy(buf + a * LANESUM_STRIPE, tmp, LANESUM_STRIPE);
        }
    CHECK(missed == 0, "%d stripe swaps give the same sum", missed);
    CHECK(lanesum64_scalar(buf, N) == good, "the buffer is back as it was");
    /* a short read leaves the slot's second half as the bundle read into it before */
    uint8_t *stale = malloc(N);
    fill(stale, N, 99);
    memcpy(stale, buf, N / 2);
    CHECK(lanesum64_scalar(stale, N) != good, "a half-read slot passes");
    memset(stale + N / 2, 0, N / 2);
    CHECK(lanesum64_scalar(stale, N) != good, "a half-read zeroed slot passes");
    free(stale);
    /* zero bytes more or less: the length counts */
    static uint8_t zeros[LANESUM_STRIPE * 3];
    for (size_t n = 0; n < sizeof zeros; n++)
        CHECK(lanesum64_scalar(zeros, n) != lanesum64_scalar(zeros, n + 1), "%zu and %zu zero bytes sum alike", n,
              n + 1);
}

int main(void) {
    uint8_t *buf = malloc(MAX_N + MAX_SHIFT);
    fill(buf, MAX_N + MAX_SHIFT, 7);
    test_definition(buf);
    test_detects(buf);

    const kernels *sets[] = {kernels_avx2(), kernels_avx512(), kernels_amx(), kernels_avx512_exact(), kernels_neon(),
                             kernels_neon_without_sdot()};
    static const char *names[] = {"avx2", "avx512", "amx", "avx512-exact", "neon", "neon without SDOT"};
    for (size_t s = 0; s < sizeof sets / sizeof *sets; s++) {
        if (!sets[s]) {
            SKIP("kernel set %s (this CPU lacks it)", names[s]);
            continue;
        }
        CHECK(sets[s]->lanesum64 != NULL, "set %s has a lanesum64", names[s]);
        int wrong = 0;
        for (size_t n = 0; n <= MAX_N; n += n < 600 ? 1 : 509)
            for (int shift = 0; shift <= MAX_SHIFT; shift += 3)
                wrong += sets[s]->lanesum64(buf + shift, n) != lanesum64_scalar(buf + shift, n);
        CHECK(wrong == 0, "set %s: %d lengths and alignments differ from the reference", names[s], wrong);
    }
    CHECK(kernels_scalar()->lanesum64 == lanesum64_scalar, "the scalar set: the reference");
    CHECK(bundle_sum(buf, 8192) == lanesum64_scalar(buf, 8192) &&
              bundle_sum_cold(buf + 1, 4096) == lanesum64_scalar(buf + 1, 4096),
          "bundle files: lanesum64 by whichever set runs");
    free(buf);
    return test_summary();
}
