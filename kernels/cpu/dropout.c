/* CPU dropout. The stream words are drawn first (ct_rng_u32, itself parallel and
 * thread-count independent), then chunks of elements are masked and scaled in
 * parallel; bf16/f16 chunks are widened into a stack buffer, scaled in f32 and
 * rounded once. */
#include "kernels/cpu/dropout.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/threads.h"

#define PAR_MIN 32768 /* elements below which a loop stays on one thread */
#define CHUNK 4096    /* elements per task */

/* Smallest word that is kept: u32 >= p * 2^32 <=> u32 >= ceil(p * 2^32) (exact in
 * double: p * 2^32 only shifts the exponent). 2^32 for p = 1: nothing kept. */
static uint64_t keep_threshold(double p) { return (uint64_t)ceil(p * 4294967296.0); }

/* dst (n) = keep[i] ? src[i] * s : 0 in src's float dtype, mask from keep bytes. */
static void scale_masked(ct_dtype dt, const void *src, void *dst, const uint8_t *keep, double scale, int64_t n)
{
    int64_t nchunks = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN)
    for (int64_t k = 0; k < nchunks; k++) {
        int64_t i0 = k * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
        const uint8_t *restrict m = keep + i0;
        if (dt == CT_DTYPE_F64) {
            const double *restrict x = (const double *)src + i0;
            double *restrict y = (double *)dst + i0;
            for (int64_t i = 0; i < len; i++) y[i] = m[i] ? x[i] * scale : 0.0;
        } else if (dt == CT_DTYPE_F32) {
            const float *restrict x = (const float *)src + i0;
            float *restrict y = (float *)dst + i0, s = (float)scale;
            for (int64_t i = 0; i < len; i++) y[i] = m[i] ? x[i] * s : 0.0f;
        } else {
            float buf[CHUNK], s = (float)scale;
            size_t es = ct_dtype_size(dt);
            ct_convert_n(CT_DTYPE_F32, buf, dt, (const char *)src + i0 * (int64_t)es, len, false);
            for (int64_t i = 0; i < len; i++) buf[i] = m[i] ? buf[i] * s : 0.0f;
            ct_convert_n(dt, (char *)dst + i0 * (int64_t)es, CT_DTYPE_F32, buf, len, false);
        }
    }
}

// x (n) -> y (n), mask (n) u8; mask[i] = u32_i >= p * 2^32; y = mask ? x / (1 - p) : 0
ct_status cti_cpu_dropout(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask)
{
    int64_t n = ct_tensor_numel(x);
    uint8_t *m = ct_tensor_data(mask);
    if (n == 0) return CT_OK;
    if (p == 0 || p == 1) {
        memset(m, p == 0, (size_t)n);
        if (p == 0) memcpy(ct_tensor_data(y), ct_tensor_data(x), ct_tensor_nbytes(x));
        else memset(ct_tensor_data(y), 0, ct_tensor_nbytes(y)); /* all-zero bits are +0 in every float format */
        return CT_OK;
    }
    ct_frame_push();
    ct_tensor *wt = ct_tensor_empty(CT_DTYPE_I32, 1, &n); /* n u32 words */
    if (!wt) {
        ct_frame_pop();
        return ct_last_status();
    }
    uint32_t *w = ct_tensor_data(wt);
    ct_rng_u32(rng, w, n);
    uint64_t thr = keep_threshold(p);
    #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) m[i] = (uint64_t)w[i] >= thr;
    scale_masked(x->dtype, ct_tensor_data(x), ct_tensor_data(y), m, 1.0 / (1.0 - p), n);
    ct_frame_pop();
    return CT_OK;
}

// dy (n), mask (n) -> dx (n) = mask ? dy / (1 - p) : 0; overwritten
ct_status cti_cpu_dropout_backward(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx)
{
    int64_t n = ct_tensor_numel(dy);
    if (p == 1) {
        memset(ct_tensor_data(dx), 0, ct_tensor_nbytes(dx));
        return CT_OK;
    }
    /* u8 and bool masks alike: any non-zero byte keeps */
    scale_masked(dy->dtype, ct_tensor_data(dy), ct_tensor_data(dx), ct_tensor_data(mask), 1.0 / (1.0 - p), n);
    return CT_OK;
}

/* ---- reference: the rule applied literally, one element at a time in double -- */

ct_status cti_cpu_dropout_ref(const ct_tensor *x, double p, ct_rng *rng, ct_tensor *y, ct_tensor *mask)
{
    int64_t n = ct_tensor_numel(x);
    size_t es = ct_dtype_size(x->dtype);
    uint8_t *m = ct_tensor_data(mask);
    ct_frame_push();
    ct_tensor *wt = ct_tensor_empty(CT_DTYPE_I32, 1, &n);
    if (!wt) {
        ct_frame_pop();
        return ct_last_status();
    }
    uint32_t *w = ct_tensor_data(wt);
    if (p > 0 && p < 1) ct_rng_u32(rng, w, n);
    for (int64_t i = 0; i < n; i++) {
        bool keep = p == 0 ? true : p == 1 ? false : (double)w[i] >= p * 4294967296.0;
        double v = ct_scalar_load(x->dtype, (const char *)ct_tensor_data(x) + i * (int64_t)es);
        m[i] = keep;
        ct_scalar_store(y->dtype, (char *)ct_tensor_data(y) + i * (int64_t)es, keep ? v / (1 - p) : 0);
    }
    ct_frame_pop();
    return CT_OK;
}

ct_status cti_cpu_dropout_backward_ref(const ct_tensor *dy, const ct_tensor *mask, double p, ct_tensor *dx)
{
    int64_t n = ct_tensor_numel(dy);
    size_t es = ct_dtype_size(dy->dtype);
    const uint8_t *m = ct_tensor_data(mask);
    for (int64_t i = 0; i < n; i++) {
        double v = ct_scalar_load(dy->dtype, (const char *)ct_tensor_data(dy) + i * (int64_t)es);
        ct_scalar_store(dx->dtype, (char *)ct_tensor_data(dx) + i * (int64_t)es, m[i] && p < 1 ? v / (1 - p) : 0);
    }
    return CT_OK;
}
