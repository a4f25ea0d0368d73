/* int8_peak_macs: see int8_peak.h. */
#include "kernels/int8_peak.h"

#include "util/clock.h"

#define ROUND_ITERS (1u << 20)

double int8_peak_macs(double seconds, const char **isa) {
    uint64_t (*run)(uint64_t) = NULL;
    *isa = "none";
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni"))
        run = int8_peak_avx512, *isa = "avx512 vpdpbusd";
    else if (__builtin_cpu_supports("avx2"))
        run = int8_peak_avx2, *isa = "avx2 vpmaddubsw+vpmaddwd";
    if (!run) return 0;
    run(ROUND_ITERS / 8); /* warm-up: the wide units power up */
    uint64_t macs = 0;
    double t0 = clock_seconds(), t;
    do {
        macs += run(ROUND_ITERS);
        t = clock_seconds() - t0;
    } while (t < seconds);
    return (double)macs / t;
}
