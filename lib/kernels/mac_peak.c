/* int8_peak_macs and f32_peak_macs: see mac_peak.h. */
#include "kernels/mac_peak.h"

#include "util/clock.h"

/* the loops are x86 files, compiled only for x86-64 */
#if defined(__x86_64__)
#define ROUND_ITERS (1u << 20)

static double rate(uint64_t (*run)(uint64_t), double seconds) {
    run(ROUND_ITERS / 8); /* warm-up: the wide units power up */
    uint64_t macs = 0;
    double t0 = clock_seconds(), t;
    do {
        macs += run(ROUND_ITERS);
        t = clock_seconds() - t0;
    } while (t < seconds);
    return (double)macs / t;
}

/* the ISA files are built with the AVX-512 (VNNI) and AVX2 (+FMA) flags: the checks match them */
static int cpu_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}
static int cpu_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

double int8_peak_macs(double seconds, const char **isa) {
    if (cpu_avx512()) {
        *isa = "avx512 vpdpbusd";
        return rate(int8_peak_avx512, seconds);
    }
    if (cpu_avx2()) {
        *isa = "avx2 vpmaddubsw+vpmaddwd";
        return rate(int8_peak_avx2, seconds);
    }
    *isa = "none";
    return 0;
}

double f32_peak_macs(double seconds, const char **isa) {
    if (cpu_avx512()) {
        *isa = "avx512 vfmadd231ps";
        return rate(f32_peak_avx512, seconds);
    }
    if (cpu_avx2()) {
        *isa = "avx2 vfmadd231ps";
        return rate(f32_peak_avx2, seconds);
    }
    *isa = "none";
    return 0;
}
#else
double int8_peak_macs(double seconds, const char **isa) {
    (void)seconds;
    *isa = "none";
    return 0;
}

double f32_peak_macs(double seconds, const char **isa) {
    (void)seconds;
    *isa = "none";
    return 0;
}
#endif
