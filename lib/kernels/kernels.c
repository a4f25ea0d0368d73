/* Run-time choice of the kernel set, every family at once (kernels.h says
 * how). The SIMD tables live in files compiled with their ISA flags; this
 * file is built for the baseline ISA so it can run the CPU checks before any
 * of that code executes. The Makefile compiles the x86 ISA files only for
 * x86-64 and the NEON ones only for AArch64; a set whose files are not built
 * is absent (NULL) and the choice falls to the next. */
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "util/log.h"

/* defined in kernels_scalar.c, kernels_avx2.c, kernels_avx512.c, kernels_neon.c */
extern const kernels kernels_scalar_impl;
extern const kernels kernels_avx2_impl;
extern const kernels kernels_avx512_impl;
extern const kernels kernels_avx512_stream_impl;
extern const kernels kernels_avx512_exact_impl;
extern const kernels kernels_neon_impl;
extern const kernels kernels_neon_sdot_impl;
extern const kernels kernels_neon_without_sdot_impl;

const kernels *kernels_scalar(void) { return &kernels_scalar_impl; }

#if defined(__x86_64__)
/* CPUID.1:ECX bit 29, read directly: not every compiler's __builtin_cpu_supports knows "f16c" */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

const kernels *kernels_avx2(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) return &kernels_avx2_impl;
    return NULL;
}

/* the AVX-512 kernel files are compiled with these (plus the AVX2 set) and use VNNI */
static int cpu_runs_avx512(void) {
    __builtin_cpu_init();
    return kernels_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

/* CPUID.1:EAX's family, with the extended family added as the SDM and AMD's APM say */
static unsigned cpu_family(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned base = (a >> 8) & 0xf;
    return base == 0xf ? base + ((a >> 20) & 0xff) : base;
}

/* The dense Q4_0 gemv prefetches the next pass as one stream into L1 on AMD
 * Zen 5 and later (family 0x1a), each row's next row into L2 elsewhere: each
 * as measured (kernels_fast_avx512.c); Zen 4 (family 0x19, AVX-512 on 256-bit
 * units) measured as Intel does. The same bits either way. */
static const kernels *avx512_for_cpu(bool own) {
    __builtin_cpu_init();
    const bool stream = __builtin_cpu_is("amd") && cpu_family() >= 0x1a;
    return stream == own ? &kernels_avx512_stream_impl : &kernels_avx512_impl;
}

const kernels *kernels_avx512(void) { return cpu_runs_avx512() ? avx512_for_cpu(true) : NULL; }
const kernels *kernels_avx512_other_prefetch(void) { return cpu_runs_avx512() ? avx512_for_cpu(false) : NULL; }
const kernels *kernels_avx512_exact(void) { return cpu_runs_avx512() ? &kernels_avx512_exact_impl : NULL; }

/* CPUID.(7,0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), and Linux's leave to
 * use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA,
 * once for the whole process) */
static int amx_usable(void) {
    unsigned a, b, c, d;
    if (!cpu_runs_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return 0;
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static kernels amx_set;
static int amx_ok;

/* avx512's table, every family, but for the prefill product */
static void make_amx_set(void) {
    if (!(amx_ok = amx_usable())) return;
    amx_set = *kernels_avx512();
    amx_set.name = "amx";
    amx_set.gemm_q4_0 = gemm_q4_0_amx;
}

const kernels *kernels_amx(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_amx_set);
    return amx_ok ? &amx_set : NULL;
}
#else
const kernels *kernels_avx2(void) { return NULL; }
const kernels *kernels_avx512(void) { return NULL; }
const kernels *kernels_avx512_other_prefetch(void) { return NULL; }
const kernels *kernels_avx512_exact(void) { return NULL; }
const kernels *kernels_amx(void) { return NULL; }
#endif

#if defined(__aarch64__)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
/* FEAT_DotProd: SDOT, which the kernels_neon_sdot_impl table's kernels use */
static int cpu_has_sdot(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }

const kernels *kernels_neon(void) { return cpu_has_sdot() ? &kernels_neon_sdot_impl : &kernels_neon_impl; }
const kernels *kernels_neon_without_sdot(void) { return &kernels_neon_without_sdot_impl; }
#else
const kernels *kernels_neon(void) { return NULL; }
const kernels *kernels_neon_without_sdot(void) { return NULL; }
#endif

const kernels *kernels_by_name(const char *name) {
    if (strcmp(name, "scalar") == 0) return kernels_scalar();
    if (strcmp(name, "avx2") == 0) return kernels_avx2();
    if (strcmp(name, "avx512") == 0) return kernels_avx512();
    if (strcmp(name, "avx512-exact") == 0) return kernels_avx512_exact();
    if (strcmp(name, "amx") == 0) return kernels_amx();
    if (strcmp(name, "neon") == 0) return kernels_neon();
    return NULL;
}

static const kernels *chosen;

static void choose_kernels(void) {
    const kernels *fastest = kernels_amx();
    if (!fastest) fastest = kernels_avx512();
    if (!fastest) fastest = kernels_avx2();
    if (!fastest) fastest = kernels_neon();
    if (!fastest) fastest = kernels_scalar();
    chosen = fastest;

    const char *want = getenv("PI2_KERNELS");
    if (!want || !*want) return;
    const kernels *forced = kernels_by_name(want);
    if (!forced) {
        log_warn("PI2_KERNELS=%s is not one of scalar|avx2|avx512|avx512-exact|amx|neon that this CPU can run; using %s",
                 want, fastest->name);
        return;
    }
    chosen = forced;
}

const kernels *kernels_best(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, choose_kernels);
    return chosen;
}
