/* cpu_relax(): one step of a spin-wait on a flag that another thread or
 * process sets. It tells the core that the loop is a spin (x86 PAUSE, ARM
 * YIELD), so a sibling hardware thread gets the core's resources and leaving
 * the loop costs no memory-order mis-speculation; on other targets it does
 * nothing. It orders nothing: the loops that call it read the flag with an
 * atomic load.
 *
 * Errors: none: a hint to the core, with no result. */
#ifndef PI2_CPU_RELAX_H
#define PI2_CPU_RELAX_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax(void) { __asm__ volatile("yield"); }
#else
static inline void cpu_relax(void) {}
#endif

#endif
