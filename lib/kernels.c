/* Run-time choice of the kernel set. The SIMD tables live in files compiled
 * with their ISA flags; this file is baseline x86-64 so it can run the CPU
 * checks before any of that code executes. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "log.h"

/* defined in kernels_scalar.c, kernels_avx2.c, kernels_avx512.c */
extern const kernels kernels_scalar_impl;
extern const kernels kernels_avx2_impl;
extern const kernels kernels_avx512_impl;

const kernels *kernels_scalar(void) { return &kernels_scalar_impl; }

const kernels *kernels_avx2(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return &kernels_avx2_impl;
    return NULL;
}

const kernels *kernels_avx512(void) {
    __builtin_cpu_init();
    /* kernels_avx512.c is compiled with these (plus the AVX2 set) and uses VNNI */
    if (kernels_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        return &kernels_avx512_impl;
    return NULL;
}

static const kernels *chosen;

static void choose_kernels(void) {
    const kernels *fastest = kernels_avx512();
    if (!fastest) fastest = kernels_avx2();
    if (!fastest) fastest = kernels_scalar();
    chosen = fastest;

    const char *want = getenv("PI2_KERNELS");
    if (!want || !*want) return;
    const kernels *forced = NULL;
    if (strcmp(want, "scalar") == 0) forced = kernels_scalar();
    else if (strcmp(want, "avx2") == 0) forced = kernels_avx2();
    else if (strcmp(want, "avx512") == 0) forced = kernels_avx512();
    else {
        log_warn("PI2_KERNELS=%s is not one of scalar|avx2|avx512; using %s", want, fastest->name);
        return;
    }
    if (!forced) {
        log_warn("PI2_KERNELS=%s: this CPU cannot run it; using %s", want, fastest->name);
        return;
    }
    chosen = forced;
}

const kernels *kernels_best(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, choose_kernels);
    return chosen;
}
