/* ctrain — counter-based random numbers (Philox4x32-10).
 *
 * Philox (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
 * SC 2011) is a keyed bijection on 128-bit counters: out = philox(ctr, key). Random
 * numbers are a pure function of (seed, position), with no sequential state, so a fill
 * gives the same bits on any device and for any thread count.
 *
 * Stream layout (the contract every backend must follow):
 *   key           = { (uint32)seed, (uint32)(seed >> 32) }
 *   word w        = 32-bit output number w of the stream, w = 0, 1, 2, ...
 *   block b       = w / 4, lane = w % 4
 *   word w        = philox({ (uint32)b, (uint32)(b >> 32), 0, 0 }, key)[lane]
 * (ctr[2], ctr[3] are reserved, zero; a future per-device or per-stream subsequence
 * id may go there without changing existing streams.)
 *
 * A ct_rng is (seed, offset) where offset counts words consumed. Every fill starts on a
 * block boundary, s = offset rounded up to a multiple of 4 (it already is, unless set
 * by hand), reads words s, s+1, ..., and leaves offset = s + (words read rounded up to a
 * multiple of 4), so blocks never straddle calls and splitting one fill into two gives
 * the same numbers whenever the first part consumes whole blocks. Offsets wrap mod 2^64.
 *
 * Element i of a fill reads, relative to s:
 *   ct_rng_u32, ct_rng_uniform_f32   word i                     (words used: n)
 *   ct_rng_normal_f32                words 2*(i/2), 2*(i/2)+1   (pair; even i: cos, odd: sin)
 *   ct_rng_uniform_f64               words 2i, 2i+1             (words used: 2n)
 *   ct_rng_normal_f64                words 4*(i/2) .. +3        (pair of two 64-bit uniforms)
 *
 * Bad input (NULL generator or output, n < 0) records an error (ct_last_error) and
 * does nothing: no output written, offset unchanged. Nothing here exits or aborts.
 */
#ifndef CT_CORE_PHILOX_H
#define CT_CORE_PHILOX_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdint.h>

#include "core/api.h"

/* One Philox4x32-10 block: out = philox(ctr[4], key[2]), 10 rounds, Salmon et al. 2011
 * constants (M0=0xD2511F53, M1=0xCD9E8D57, W0=0x9E3779B9, W1=0xBB67AE85). out may alias ctr. */
CT_API void ct_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A stream: seed (64-bit -> key) and a 64-bit offset counting 32-bit outputs consumed.
 * A plain value: copy it to fork a stream, store both fields to checkpoint it. */
typedef struct ct_rng {
    uint64_t seed;
    uint64_t offset;
} ct_rng;

/* seed = seed, offset = 0. */
CT_API void ct_rng_init(ct_rng *r, uint64_t seed);

/* out[i] = lo + (hi - lo) * u, u = (word >> 8) * 2^-24 in [0, 1) (24 random bits). For
 * lo < hi (hi - lo finite) every value lies in [lo, hi): a value that rounds up to hi is
 * replaced by the largest float below hi. */
CT_API void ct_rng_uniform_f32(ct_rng *r, float *out, int64_t n, float lo, float hi);
/* As f32 with u = (((uint64)word[2i+1] << 32 | word[2i]) >> 11) * 2^-53 (53 random bits). */
CT_API void ct_rng_uniform_f64(ct_rng *r, double *out, int64_t n, double lo, double hi);

/* Normal(mean, std), Box-Muller on a pair of uniforms (u1, u2):
 *   u1 in (0, 1] (never log 0), u2 in [0, 1),
 *   z0 = sqrt(-2 ln u1) cos(2 pi u2),  z1 = sqrt(-2 ln u1) sin(2 pi u2),
 *   out = mean + std * z.
 * f32: u1 = ((w0 >> 8) + 1) 2^-24, u2 = (w1 >> 8) 2^-24, math in float (|z| <= 5.77).
 * f64: 53-bit uniforms from word pairs as in uniform_f64, u1 shifted by +2^-53 the same
 * way, math in double (|z| <= 8.57). An odd n drops the last sine. */
CT_API void ct_rng_normal_f32(ct_rng *r, float *out, int64_t n, float mean, float std);
CT_API void ct_rng_normal_f64(ct_rng *r, double *out, int64_t n, double mean, double std);

/* Raw 32-bit words (dropout masks, shuffles). */
CT_API void ct_rng_u32(ct_rng *r, uint32_t *out, int64_t n);

/* Uniform integer in [0, n) without modulo bias, for shuffles. Each attempt reads one
 * block as two 64-bit candidates x = word[2k+1] << 32 | word[2k]; x is accepted when
 * x >= 2^64 mod n (then x mod n is exactly uniform), else the next candidate/block is
 * tried (rejection probability < n / 2^64). Consumes 4 words per block read.
 * n = 0 (and a NULL r) returns 0 and records an error; n = 1 returns 0. */
CT_API uint64_t ct_rng_below(ct_rng *r, uint64_t n);

/* Process-wide default generator, seed 0x5eed until ct_set_seed. ct_set_seed(s) sets it
 * to (seed s, offset 0). Thread-safe: the ct_rng_* functions given the default generator
 * reserve their words under a mutex, so concurrent callers get disjoint words (which
 * caller gets which depends on scheduling). Reading or writing its fields directly is
 * not synchronised. */
CT_API void ct_set_seed(uint64_t seed);
/* Borrowed; valid for the life of the process. */
CT_API ct_rng *ct_rng_default(void);

#ifdef __cplusplus
}
#endif

#endif
