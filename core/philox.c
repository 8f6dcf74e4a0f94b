/* ctrain — Philox4x32-10 and the fills built on it. Stream layout: see core/philox.h. */
#include "core/philox.h"
#include "core/philox_bits.h"

#include "core/error.h"

#include <math.h>
#include <pthread.h>

/* Fills of at most this many blocks run on the calling thread: below it, starting an
 * OpenMP team costs more than the work. Only speed depends on it, never the bits. */
#define PAR_MIN_BLOCKS 4096
#ifdef _OPENMP
/* Splits the block loop of a fill (its count is the local `nb`) across threads. */
#define PARALLEL_OVER_BLOCKS _Pragma("omp parallel for schedule(static) if (nb > PAR_MIN_BLOCKS)")
#else
#define PARALLEL_OVER_BLOCKS
#endif

/* The block function lives in core/philox_bits.h, shared with the CUDA kernels. */
void ct_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) { cti_philox4x32_10(ctr, key, out); }

static inline void stream_block(uint64_t seed, uint64_t b, uint32_t w[4]) { cti_philox_stream_block(seed, b, w); }

/* ---- stream bookkeeping ------------------------------------------------------------ */

static ct_rng g_default = {0x5eed, 0};
static pthread_mutex_t g_default_mu = PTHREAD_MUTEX_INITIALIZER;

static void default_lock(void) { CT_ASSERT(pthread_mutex_lock(&g_default_mu) == 0); }
static void default_unlock(void) { CT_ASSERT(pthread_mutex_unlock(&g_default_mu) == 0); }

/* Reserves `blocks` whole blocks: returns the seed and first block to use and advances
 * the offset past them. The default generator is updated under its mutex. */
void cti_rng_reserve_blocks(ct_rng *r, uint64_t blocks, uint64_t *seed, uint64_t *first)
{
    int shared = (r == &g_default);
    if (shared)
        default_lock();
    uint64_t start = r->offset / 4 + (r->offset % 4 != 0); /* round up to a block boundary */
    *seed = r->seed;
    *first = start;
    r->offset = (start + blocks) * 4; /* mod 2^64 */
    if (shared)
        default_unlock();
}

/* Argument checks: false when the fill must not run (bad input records an error; n = 0
 * is a no-op that leaves the offset as it is). */
static int fill_should_run(const char *op, const ct_rng *r, const void *out, int64_t n)
{
    if (!r) {
        ct_error_set(CT_ERR_INVALID, "%s: generator is NULL", op);
        return 0;
    }
    if (n < 0) {
        ct_error_set(CT_ERR_INVALID, "%s: n = %lld is negative", op, (long long)n);
        return 0;
    }
    if (n > 0 && !out) {
        ct_error_set(CT_ERR_INVALID, "%s: output is NULL for n = %lld", op, (long long)n);
        return 0;
    }
    return n > 0;
}

void ct_rng_init(ct_rng *r, uint64_t seed)
{
    if (!r) {
        ct_error_set(CT_ERR_INVALID, "ct_rng_init: generator is NULL");
        return;
    }
    r->seed = seed;
    r->offset = 0;
}

void ct_set_seed(uint64_t seed)
{
    default_lock();
    g_default.seed = seed;
    g_default.offset = 0;
    default_unlock();
}

ct_rng *ct_rng_default(void) { return &g_default; }

/* ---- word -> number maps ------------------------------------------------------------ */

/* [0, 1): top 24 bits, exact in float. */
static inline float u01_f32(uint32_t w) { return (float)(w >> 8) * 0x1p-24f; }
/* (0, 1]: never 0, so log() is finite. */
static inline float u01_open0_f32(uint32_t w) { return (float)((w >> 8) + 1) * 0x1p-24f; }
/* 53 bits from two words, lo word first. */
static inline uint64_t bits53(uint32_t lo, uint32_t hi) { return (((uint64_t)hi << 32) | lo) >> 11; }
static inline double u01_f64(uint32_t lo, uint32_t hi) { return (double)bits53(lo, hi) * 0x1p-53; }
static inline double u01_open0_f64(uint32_t lo, uint32_t hi)
{
    return (double)(bits53(lo, hi) + 1) * 0x1p-53;
}

/* lo + (hi - lo) u for u in [0, 1); rounding can reach hi, which [lo, hi) excludes. */
static inline float affine_f32(float lo, float hi, float u)
{
    float v = lo + (hi - lo) * u;
    return (v >= hi && lo < hi) ? nextafterf(hi, lo) : v;
}
static inline double affine_f64(double lo, double hi, double u)
{
    double v = lo + (hi - lo) * u;
    return (v >= hi && lo < hi) ? nextafter(hi, lo) : v;
}

/* ---- fills ---------------------------------------------------------------------------
 * Each fill computes block `first + b` for b in [0, nblocks) and writes the elements that
 * block owns; no element depends on another block, so the parallel loop's split across
 * threads cannot change any value. */

/* Elements per block: 4 for one-word elements and f32 normals, 2 for f64 elements. */
static inline int64_t blocks_for(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

void ct_rng_u32(ct_rng *r, uint32_t *out, int64_t n)
{
    if (!fill_should_run("ct_rng_u32", r, out, n))
        return;
    int64_t nb = blocks_for(n, 4);
    uint64_t seed, first;
    cti_rng_reserve_blocks(r, (uint64_t)nb, &seed, &first);
    PARALLEL_OVER_BLOCKS
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        stream_block(seed, first + (uint64_t)b, w);
        int64_t i0 = 4 * b, m = n - i0 < 4 ? n - i0 : 4;
        for (int64_t k = 0; k < m; k++)
            out[i0 + k] = w[k];
    }
}

void ct_rng_uniform_f32(ct_rng *r, float *out, int64_t n, float lo, float hi)
{
    if (!fill_should_run("ct_rng_uniform_f32", r, out, n))
        return;
    int64_t nb = blocks_for(n, 4);
    uint64_t seed, first;
    cti_rng_reserve_blocks(r, (uint64_t)nb, &seed, &first);
    PARALLEL_OVER_BLOCKS
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        stream_block(seed, first + (uint64_t)b, w);
        int64_t i0 = 4 * b, m = n - i0 < 4 ? n - i0 : 4;
        for (int64_t k = 0; k < m; k++)
            out[i0 + k] = affine_f32(lo, hi, u01_f32(w[k]));
    }
}

void ct_rng_uniform_f64(ct_rng *r, double *out, int64_t n, double lo, double hi)
{
    if (!fill_should_run("ct_rng_uniform_f64", r, out, n))
        return;
    int64_t nb = blocks_for(n, 2);
    uint64_t seed, first;
    cti_rng_reserve_blocks(r, (uint64_t)nb, &seed, &first);
    PARALLEL_OVER_BLOCKS
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        stream_block(seed, first + (uint64_t)b, w);
        int64_t i0 = 2 * b;
        out[i0] = affine_f64(lo, hi, u01_f64(w[0], w[1]));
        if (i0 + 1 < n)
            out[i0 + 1] = affine_f64(lo, hi, u01_f64(w[2], w[3]));
    }
}

/* Box-Muller: (u1, u2) -> r = sqrt(-2 ln u1), theta = 2 pi u2; z = (r cos theta, r sin theta)
 * are two independent standard normals. */
void ct_rng_normal_f32(ct_rng *r, float *out, int64_t n, float mean, float std)
{
    if (!fill_should_run("ct_rng_normal_f32", r, out, n))
        return;
    const float two_pi = 6.28318530717958647692f;
    int64_t nb = blocks_for(n, 4);
    uint64_t seed, first;
    cti_rng_reserve_blocks(r, (uint64_t)nb, &seed, &first);
    PARALLEL_OVER_BLOCKS
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        stream_block(seed, first + (uint64_t)b, w);
        for (int64_t p = 0; p < 2; p++) { /* pairs (w0, w1) and (w2, w3) */
            int64_t i = 4 * b + 2 * p;
            if (i >= n)
                break;
            float rad = sqrtf(-2.0f * logf(u01_open0_f32(w[2 * p])));
            float theta = two_pi * u01_f32(w[2 * p + 1]);
            out[i] = mean + std * (rad * cosf(theta));
            if (i + 1 < n)
                out[i + 1] = mean + std * (rad * sinf(theta));
        }
    }
}

void ct_rng_normal_f64(ct_rng *r, double *out, int64_t n, double mean, double std)
{
    if (!fill_should_run("ct_rng_normal_f64", r, out, n))
        return;
    const double two_pi = 6.28318530717958647692;
    int64_t nb = blocks_for(n, 2);
    uint64_t seed, first;
    cti_rng_reserve_blocks(r, (uint64_t)nb, &seed, &first);
    PARALLEL_OVER_BLOCKS
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        stream_block(seed, first + (uint64_t)b, w);
        int64_t i = 2 * b;
        double rad = sqrt(-2.0 * log(u01_open0_f64(w[0], w[1])));
        double theta = two_pi * u01_f64(w[2], w[3]);
        out[i] = mean + std * (rad * cos(theta));
        if (i + 1 < n)
            out[i + 1] = mean + std * (rad * sin(theta));
    }
}

/* Rejection sampling: with t = 2^64 mod n, [t, 2^64) holds exactly floor(2^64 / n)
 * copies of each residue, so x mod n for accepted x is uniform on [0, n). */
uint64_t ct_rng_below(ct_rng *r, uint64_t n)
{
    if (!r) {
        ct_error_set(CT_ERR_INVALID, "ct_rng_below: generator is NULL");
        return 0;
    }
    if (n == 0) {
        ct_error_set(CT_ERR_INVALID, "ct_rng_below: n = 0 (empty range)");
        return 0;
    }
    uint64_t t = (0 - n) % n; /* (2^64 - n) mod n = 2^64 mod n */
    for (;;) {
        uint64_t seed, first;
        uint32_t w[4];
        cti_rng_reserve_blocks(r, 1, &seed, &first);
        stream_block(seed, first, w);
        for (int k = 0; k < 2; k++) {
            uint64_t x = ((uint64_t)w[2 * k + 1] << 32) | w[2 * k];
            if (x >= t)
                return x % n;
        }
    }
}
