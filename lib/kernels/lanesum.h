/* lanesum64: the checksum of a bundle, verified on every read of one from
 * storage (lib/plan/bundle.c), so it must cost little beside the read.
 * checksum64 (util/checksum.h) chains 64-bit multiplies, which no x86 SIMD
 * unit has; this sum is built from 32 x 32 -> 64-bit ones, which every SIMD
 * unit pi2 meets has (PMULUDQ, VMULL.U32).
 *
 * The definition, the same bits in every set: the bytes are read as
 * little-endian 64-bit words, in stripes of eight (64 bytes); word k of
 * stripe s goes to lane k:
 *     x = w ^ (LANESUM_KEY[k] + s * LANESUM_STEP)
 *     acc[k] += lo32(x) * hi32(x) + w                  (mod 2^64)
 * acc[k] starting at LANESUM_SEED[k]. The key that moves with the stripe
 * makes the sum depend on where a word is, not only on which words there
 * are (two stripes swapped change it), and "+ w" keeps every bit of a word in
 * play where its halves multiply to little. The lanes, then the bytes after
 * the last whole stripe, then the length are folded in with checksum_mix.
 * It detects corruption, not an adversary.
 *
 * Errors: none: the sum is defined for any n, 0 included. */
#ifndef PI2_LANESUM_H
#define PI2_LANESUM_H

#include <stddef.h>
#include <stdint.h>

#define LANESUM_LANES 8
#define LANESUM_STRIPE (8 * LANESUM_LANES)
#define LANESUM_STEP 0x9e3779b97f4a7c15ull

extern const uint64_t LANESUM_KEY[LANESUM_LANES];
extern const uint64_t LANESUM_SEED[LANESUM_LANES];

typedef uint64_t (*lanesum_fn)(const void *data, size_t n);

uint64_t lanesum64_scalar(const void *data, size_t n);
/* the end every version shares: lanes, tail bytes (n % LANESUM_STRIPE of
 * them at tail), length */
uint64_t lanesum_finish(const uint64_t acc[LANESUM_LANES], const uint8_t *tail, size_t n);

/* per ISA, reached through a kernel set after its CPU check */
uint64_t lanesum64_avx2(const void *data, size_t n);
uint64_t lanesum64_avx512(const void *data, size_t n);
uint64_t lanesum64_neon(const void *data, size_t n);

#endif
