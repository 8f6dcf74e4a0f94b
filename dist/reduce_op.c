/* Reduction kernels of the collectives: combine two buffers elementwise, widen the
 * input to the accumulation dtype, finish (average, round) into the output.
 *
 * Rounding points, bf16 and f16 (the contract in dist/comm_internal.h):
 *   1. widen: bf16/f16 -> f32 is exact;
 *   2. combine: each f32 operation rounds to f32, as f32 arithmetic does; the
 *      partial sums travel between ranks as f32;
 *   3. AVG: the f32 sum is divided by the group size once, in f32;
 *   4. finish: the f32 result is rounded to bf16/f16 once (nearest, ties to even).
 * So the whole reduction runs in f32 and the only low-precision rounding is the last.
 *
 * MAX and MIN propagate NaN (x > y || x != x ? x : y): a NaN on any rank makes the
 * result NaN. Integer sums are done in unsigned arithmetic, so they wrap around in
 * two's complement instead of overflowing (undefined in C); integer AVG is C division
 * of the sum, truncating toward zero.
 */
#include <stdint.h>
#include <string.h>

#include "core/convert.h"
#include "dist/comm_internal.h"

bool cti_reduce_dtype_ok(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16 ||
           dt == CT_DTYPE_I32 || dt == CT_DTYPE_I64;
}

ct_dtype cti_reduce_acc_dtype(ct_dtype dt) { return dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16 ? CT_DTYPE_F32 : dt; }

/* d[i] = d[i] (op) s[i] for n elements of type T; SUM is its addition (wrapping for
 * integers), TEST_NAN its NaN test (never true for integers). */
#define COMBINE(T, SUM, TEST_NAN)                                                                  \
    do {                                                                                           \
        T *d = dst;                                                                                \
        const T *s = src;                                                                          \
        switch (op) {                                                                              \
        case CT_REDUCE_SUM:                                                                        \
        case CT_REDUCE_MEAN:                                                                       \
            for (int64_t i = 0; i < n; i++) d[i] = SUM(d[i], s[i]);                                \
            break;                                                                                 \
        case CT_REDUCE_MAX:                                                                        \
            for (int64_t i = 0; i < n; i++) d[i] = d[i] > s[i] || TEST_NAN(d[i]) ? d[i] : s[i];    \
            break;                                                                                 \
        case CT_REDUCE_MIN:                                                                        \
            for (int64_t i = 0; i < n; i++) d[i] = d[i] < s[i] || TEST_NAN(d[i]) ? d[i] : s[i];    \
            break;                                                                                 \
        default: /* ct_pg_* checked op at submission */                                           \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

#define ADD(a, b) ((a) + (b))
#define IS_NAN(x) ((x) != (x))
#define NEVER_NAN(x) ((void)(x), 0)
#define ADD_U32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define ADD_U64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))

void cti_reduce_combine(ct_dtype acc, ct_reduce_op op, void *dst, const void *src, int64_t n)
{
    switch (acc) {
    case CT_DTYPE_F32: COMBINE(float, ADD, IS_NAN); break;
    case CT_DTYPE_F64: COMBINE(double, ADD, IS_NAN); break;
    case CT_DTYPE_I32: COMBINE(int32_t, ADD_U32, NEVER_NAN); break;
    case CT_DTYPE_I64: COMBINE(int64_t, ADD_U64, NEVER_NAN); break;
    default: CT_ASSERT(!"reduce: not an accumulation dtype");
    }
}

void cti_reduce_widen(ct_dtype dt, void *acc, const void *in, int64_t n)
{
    float *a = acc;
    const uint16_t *h = in;
    if (dt == CT_DTYPE_BF16) {
        for (int64_t i = 0; i < n; i++) a[i] = ct_bf16_to_f32(h[i]);
    } else if (dt == CT_DTYPE_F16) {
        for (int64_t i = 0; i < n; i++) a[i] = ct_f16_to_f32(h[i]);
    } else if (acc != in && n > 0) {
        memmove(acc, in, (size_t)n * ct_dtype_size(dt));
    }
}

void cti_reduce_finish(ct_dtype dt, ct_reduce_op op, int size, void *out, const void *acc, int64_t n)
{
    bool avg = op == CT_REDUCE_MEAN;
    switch (dt) {
    case CT_DTYPE_BF16:
    case CT_DTYPE_F16: {
        const float *a = acc;
        uint16_t *o = out;
        float div = (float)size;
        for (int64_t i = 0; i < n; i++) {
            float v = avg ? a[i] / div : a[i];
            o[i] = dt == CT_DTYPE_BF16 ? ct_f32_to_bf16(v) : ct_f32_to_f16(v);
        }
        return;
    }
    case CT_DTYPE_F32:
        if (avg) {
            const float *a = acc;
            float *o = out, div = (float)size;
            for (int64_t i = 0; i < n; i++) o[i] = a[i] / div;
            return;
        }
        break;
    case CT_DTYPE_F64:
        if (avg) {
            const double *a = acc;
            double *o = out, div = (double)size;
            for (int64_t i = 0; i < n; i++) o[i] = a[i] / div;
            return;
        }
        break;
    case CT_DTYPE_I32:
        if (avg) {
            const int32_t *a = acc;
            int32_t *o = out;
            for (int64_t i = 0; i < n; i++) o[i] = a[i] / size;
            return;
        }
        break;
    case CT_DTYPE_I64:
        if (avg) {
            const int64_t *a = acc;
            int64_t *o = out;
            for (int64_t i = 0; i < n; i++) o[i] = a[i] / size;
            return;
        }
        break;
    default: CT_ASSERT(!"reduce: not a reduction dtype");
    }
    if (out != acc && n > 0) memmove(out, acc, (size_t)n * ct_dtype_size(dt));
}
