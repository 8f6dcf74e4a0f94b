/* ctrain — the Philox4x32-10 block function, shared by the CPU (core/philox.c) and
 * the CUDA kernels (kernels/cuda/dropout.cu), so that one (seed, block) gives the same
 * four words on both devices. The stream layout is in core/philox.h.
 *
 * Compiled as C these are static inline functions; compiled by nvcc they are
 * __host__ __device__ as well (CTI_HD, core/convert_bits.h). Not part of the public API. */
#ifndef CT_CORE_PHILOX_BITS_H
#define CT_CORE_PHILOX_BITS_H

#include <stdint.h>

#include "core/convert_bits.h" /* CTI_HD */
#include "core/philox.h"

#define CTI_PHILOX_M0 0xD2511F53u
#define CTI_PHILOX_M1 0xCD9E8D57u
#define CTI_PHILOX_W0 0x9E3779B9u /* golden ratio */
#define CTI_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

/* One round: (hi0, lo0) = M0 * c0, (hi1, lo1) = M1 * c2 (32x32 -> 64-bit products);
 * c' = { hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0 }. */
CTI_HD static inline void cti_philox_round(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    uint64_t p0 = (uint64_t)CTI_PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)CTI_PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c[0] = hi1 ^ c[1] ^ k0;
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k1;
    c[3] = lo0;
}

/* 10 rounds; the key is bumped by (W0, W1) between rounds (Weyl sequence). out may
 * alias ctr. */
CTI_HD static inline void cti_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += CTI_PHILOX_W0;
            k1 += CTI_PHILOX_W1;
        }
        cti_philox_round(c, k0, k1);
    }
    out[0] = c[0];
    out[1] = c[1];
    out[2] = c[2];
    out[3] = c[3];
}

/* The four words of block b of the stream keyed by seed (core/philox.h's layout). */
CTI_HD static inline void cti_philox_stream_block(uint64_t seed, uint64_t b, uint32_t w[4])
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
    cti_philox4x32_10(ctr, key, w);
}

/* Host only: reserves `blocks` whole blocks of r as every fill does (the offset rounded
 * up to a block boundary, then advanced past them; the default generator under its
 * mutex) and returns the seed and the first block to use. A device kernel given
 * (seed, first) then reads exactly the words ct_rng_u32 would have. */
void cti_rng_reserve_blocks(ct_rng *r, uint64_t blocks, uint64_t *seed, uint64_t *first);

#endif
