/* The machine's multiply-accumulate peaks, the physical limits the prefill's
 * matrix products are judged against.
 *
 * int8, for the quantized products: Independent
 * chains of the widest int8 dot instruction the CPU has, no memory traffic:
 * AVX-512 VNNI vpdpbusd (64 multiply-adds), else AVX2 vpmaddubsw + vpmaddwd +
 * vpaddd (32 for three instructions, the sequence llama.cpp and our AVX2
 * kernels use).
 *
 * Errors: none: a CPU without the instructions gets 0 and *isa "none". */
#ifndef PI2_MAC_PEAK_H
#define PI2_MAC_PEAK_H

#include <stdint.h>

/* int8 multiply-adds per second on the calling thread, measured for about
 * `seconds`; *isa names the instruction used. 0 (and *isa "none") on a CPU
 * with neither. */
double int8_peak_macs(double seconds, const char **isa);

/* The loops themselves: iters rounds of their chains; the multiply-adds done. */
uint64_t int8_peak_avx512(uint64_t iters);
uint64_t int8_peak_avx2(uint64_t iters);

/* F32, for the float products (F32 and F16 weights): independent chains of
 * the widest FMA (16 lanes on AVX-512, 8 on AVX2), no memory traffic. Same
 * contract as int8_peak_macs. */
double f32_peak_macs(double seconds, const char **isa);
uint64_t f32_peak_avx512(uint64_t iters);
uint64_t f32_peak_avx2(uint64_t iters);

#endif
