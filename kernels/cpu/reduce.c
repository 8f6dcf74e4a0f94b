/* CPU reductions.
 *
 *   x (...) -> out (x's kept dims); out[o] = reduce over the reduced dims of x[o, r]
 *
 * The dims are split into kept and reduced lists (size-1 dims dropped) and each
 * list is coalesced where strides allow, so a reduction is "nout outputs, each
 * over nred elements" with two layouts:
 *   inner  the reduced elements of one output run along a stride (a contiguous
 *          row for sum over the last dim): one task per (output, block of
 *          RED_BLOCK reduced elements), reduced with 8 independent lanes;
 *   outer  the kept dims end in a contiguous run (bias gradients: sum over the
 *          rows of an (N, C) matrix): one task per (run of up to OUTER_COLS
 *          outputs, block of reduced positions), each output accumulating down
 *          the rows, vectorised across the run.
 * Blocks depend only on the shape, partial results are combined in block
 * order, and f32/f64 accumulate in double, so the bits do not depend on the
 * thread count. f16/bf16 are widened to f32 a chunk at a time (exact);
 * integer reductions are exact in any order and use a plain per-output loop. */
#include "kernels/cpu/reduce.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/threads.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/reduce_plan.h"

/* RED_BLOCK: reduced elements per inner task; OUTER_COLS outputs per outer task,
 * which walks down OUTER_BLOCK elements' worth of rows. Fixed, so the blocks
 * (and the summation order) depend on the shape only. */
enum { RED_BLOCK = 1 << 15, OUTER_COLS = 2048, OUTER_BLOCK = 1 << 18, PAR_MIN = 32768 };

/* Internal modes: the public ops plus the second pass of var. MEAN is SUM here. */
typedef enum { M_SUM, M_MAX, M_MIN, M_SQDEV } red_mode;

/* Element offset of flat index i over a row-major (n, shape) with strides. */
static int64_t flat_offset(int n, const int64_t *shape, const int64_t *stride, int64_t i, int64_t *idx)
{
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        int64_t k = i % shape[d];
        i /= shape[d];
        if (idx) idx[d] = k;
        off += k * stride[d];
    }
    return off;
}

/* Advances a row-major multi-index over (n, shape) by one, keeping *off in step. */
static void odometer_next(int n, const int64_t *shape, const int64_t *stride, int64_t *idx, int64_t *off)
{
    for (int d = n - 1; d >= 0; d--) {
        *off += stride[d];
        if (++idx[d] < shape[d]) return;
        *off -= shape[d] * stride[d];
        idx[d] = 0;
    }
}

/* NaN-propagating max/min: the accumulator a stays NaN; a NaN v takes over. */
#define MAXNAN(a, v) (((v) > (a) || (v) != (v)) ? (v) : (a))
#define MINNAN(a, v) (((v) < (a) || (v) != (v)) ? (v) : (a))

static double combine(red_mode m, double a, double v)
{
    switch (m) {
    case M_MAX: return MAXNAN(a, v);
    case M_MIN: return MINNAN(a, v);
    default: return a + v;
    }
}

/* ---- float kernels: T = float, double, and half (f16/bf16 bits, widened on the fly) ------- */

/* seg_*: one run of n >= 1 elements at stride s. Contiguous runs use 8 lanes so
 * the loop vectorises without reassociating a single sum. dt matters for half only. */
#define DEF_SEGMENTS(T, IT)                                                                        \
    static double seg_sum_##T(ct_dtype dt, const T *p, int64_t s, int64_t n, double mean, bool sqdev) \
    {                                                                                              \
        (void)dt;                                                                                  \
        double a[8] = {0};                                                                         \
        int64_t i = 0;                                                                             \
        if (s == 1 && !sqdev) {                                                                    \
            for (; i + 8 <= n; i += 8)                                                             \
                for (int j = 0; j < 8; j++) a[j] += (double)p[i + j];                              \
        } else if (s == 1) {                                                                       \
            for (; i + 8 <= n; i += 8)                                                             \
                for (int j = 0; j < 8; j++) {                                                      \
                    double d = (double)p[i + j] - mean;                                            \
                    a[j] += d * d;                                                                 \
                }                                                                                  \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            double v = (double)p[i * s];                                                           \
            a[i & 7] += sqdev ? (v - mean) * (v - mean) : v;                                       \
        }                                                                                          \
        return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));                  \
    }                                                                                              \
                                                                                                   \
    /* max/min: gcc will not vectorise a NaN-propagating select recurrence, so the  */         \
    /* contiguous case runs in explicit 32-byte vectors (IT: same-width integers). */              \
    static double seg_ext_##T(ct_dtype dt, const T *p, int64_t s, int64_t n, bool is_max)          \
    {                                                                                              \
        (void)dt;                                                                                  \
        typedef T vec __attribute__((vector_size(32)));                                            \
        typedef IT ivec __attribute__((vector_size(32)));                                          \
        enum { W = 32 / sizeof(T) };                                                               \
        vec a;                                                                                     \
        for (int j = 0; j < W; j++) a[j] = p[0];                                                   \
        int64_t i = 0;                                                                             \
        if (s == 1) {                                                                              \
            for (; i + W <= n; i += W) {                                                           \
                vec v;                                                                             \
                memcpy(&v, p + i, sizeof v);                                                       \
                ivec c = (is_max ? v > a : v < a) | (v != v);                                      \
                a = (vec)(((ivec)v & c) | ((ivec)a & ~c));                                         \
            }                                                                                      \
        }                                                                                          \
        double r = a[0];                                                                           \
        for (int j = 1; j < W; j++) r = is_max ? MAXNAN(r, (double)a[j]) : MINNAN(r, (double)a[j]); \
        for (; i < n; i++) r = is_max ? MAXNAN(r, (double)p[i * s]) : MINNAN(r, (double)p[i * s]); \
        return r;                                                                                  \
    }
DEF_SEGMENTS(float, int32_t)
DEF_SEGMENTS(double, int64_t)

typedef uint16_t half; /* f16 or bf16 bits */
enum { HALF_CHUNK = 512 };

/* f16/bf16 runs: widened to f32 (exactly) a chunk at a time, then reduced as float. */
static double seg_sum_half(ct_dtype dt, const half *p, int64_t s, int64_t n, double mean, bool sqdev)
{
    float buf[HALF_CHUNK];
    double acc = 0;
    for (int64_t off = 0; off < n; off += HALF_CHUNK) {
        const int64_t k = n - off < HALF_CHUNK ? n - off : HALF_CHUNK;
        cti_cpu_ew_load_f32(dt, (const char *)(p + off * s), s, k, buf);
        acc += seg_sum_float(dt, buf, 1, k, mean, sqdev);
    }
    return acc;
}

static double seg_ext_half(ct_dtype dt, const half *p, int64_t s, int64_t n, bool is_max)
{
    float buf[HALF_CHUNK];
    double acc = 0;
    for (int64_t off = 0; off < n; off += HALF_CHUNK) {
        const int64_t k = n - off < HALF_CHUNK ? n - off : HALF_CHUNK;
        cti_cpu_ew_load_f32(dt, (const char *)(p + off * s), s, k, buf);
        double v = seg_ext_float(dt, buf, 1, k, is_max);
        acc = off == 0 ? v : combine(is_max ? M_MAX : M_MIN, acc, v);
    }
    return acc;
}

/* One row of nc kept-contiguous elements as something indexable by p[c]. */
#define ROW_NATIVE(T) const T *p = base + roff;
#define ROW_HALF(T)                                                                                \
    float hrow[OUTER_COLS];                                                                        \
    cti_cpu_ew_load_f32(dt, (const char *)(base + roff), 1, nc, hrow);                              \
    const float *p = hrow;

#define DEF_TASKS(T, ROW)                                                                          \
    /* inner layout: output o over reduced flat range [j0, j1) */                                  \
    static double inner_task_##T(const cti_red_plan *pl, red_mode m, ct_dtype dt, const T *x, int64_t o, \
                                 int64_t j0, int64_t j1, double mean)                              \
    {                                                                                              \
        const int nr = pl->nr;                                                                     \
        const int64_t L = nr ? pl->rshape[nr - 1] : 1, ls = nr ? pl->rstride[nr - 1] : 0;          \
        const T *base = x + flat_offset(pl->nk, pl->kshape, pl->kstride, o, NULL);                 \
        int64_t idx[CT_MAX_DIMS] = {0}, row = j0 / L, col = j0 - row * L;                          \
        int64_t roff = nr > 1 ? flat_offset(nr - 1, pl->rshape, pl->rstride, row, idx) : 0;        \
        double acc = 0;                                                                            \
        for (int64_t j = j0; j < j1; col = 0) {                                                    \
            const int64_t n = L - col < j1 - j ? L - col : j1 - j;                                 \
            const T *p = base + roff + col * ls;                                                   \
            double v = m == M_SUM || m == M_SQDEV ? seg_sum_##T(dt, p, ls, n, mean, m == M_SQDEV)  \
                                                  : seg_ext_##T(dt, p, ls, n, m == M_MAX);         \
            acc = j == j0 ? v : combine(m, acc, v);                                                \
            j += n;                                                                                \
            odometer_next(nr - 1, pl->rshape, pl->rstride, idx, &roff);                            \
        }                                                                                          \
        return acc;                                                                                \
    }                                                                                              \
                                                                                                   \
    /* outer layout: outputs [ko*J + c0, +nc) over reduced positions [r0, r1); dst[nc]. */         \
    /* Max starts at -inf and min at +inf, which NaN still overrides. */                           \
    static void outer_task_##T(const cti_red_plan *pl, red_mode m, ct_dtype dt, const T *x, int64_t ko, \
                               int64_t c0, int64_t nc, int64_t r0, int64_t r1, const double *mean, \
                               double *dst)                                                        \
    {                                                                                              \
        (void)dt;                                                                                  \
        const int nr = pl->nr;                                                                     \
        const T *base = x + flat_offset(pl->nk - 1, pl->kshape, pl->kstride, ko, NULL) + c0;       \
        int64_t idx[CT_MAX_DIMS] = {0};                                                            \
        int64_t roff = flat_offset(nr, pl->rshape, pl->rstride, r0, idx);                          \
        double acc[OUTER_COLS];                                                                    \
        const double init = m == M_MAX ? -INFINITY : m == M_MIN ? INFINITY : 0.0;                  \
        for (int64_t c = 0; c < nc; c++) acc[c] = init;                                            \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            ROW(T)                                                                                 \
            switch (m) {                                                                           \
            case M_SUM:                                                                            \
                for (int64_t c = 0; c < nc; c++) acc[c] += (double)p[c];                           \
                break;                                                                             \
            case M_SQDEV:                                                                          \
                for (int64_t c = 0; c < nc; c++) {                                                 \
                    double d = (double)p[c] - mean[c];                                             \
                    acc[c] += d * d;                                                               \
                }                                                                                  \
                break;                                                                             \
            case M_MAX:                                                                            \
                for (int64_t c = 0; c < nc; c++) acc[c] = MAXNAN(acc[c], (double)p[c]);            \
                break;                                                                             \
            default:                                                                               \
                for (int64_t c = 0; c < nc; c++) acc[c] = MINNAN(acc[c], (double)p[c]);            \
                break;                                                                             \
            }                                                                                      \
            odometer_next(nr, pl->rshape, pl->rstride, idx, &roff);                                \
        }                                                                                          \
        memcpy(dst, acc, (size_t)nc * sizeof(double));                                             \
    }
DEF_TASKS(float, ROW_NATIVE)
DEF_TASKS(double, ROW_NATIVE)
DEF_TASKS(half, ROW_HALF)

/* res[nout] = the reduction of x (f32, f64, f16, bf16) under plan; mean[nout] for M_SQDEV. */
static ct_status reduce_float(red_mode m, const ct_tensor *x, const cti_red_plan *pl, const double *mean, double *res)
{
    const ct_dtype dt = x->dtype;
    const void *xd = ct_tensor_data(x);
    const int64_t nout = pl->nout, nred = pl->nred;
    const bool outer = pl->nk > 0 && pl->kstride[pl->nk - 1] == 1 && (pl->nr == 0 || pl->rstride[pl->nr - 1] != 1);
    int64_t nblk, rb, J = 1, ncb = 1;
    if (outer) {
        J = pl->kshape[pl->nk - 1];
        ncb = (J + OUTER_COLS - 1) / OUTER_COLS;
        rb = OUTER_BLOCK / (J < OUTER_COLS ? J : OUTER_COLS);
    } else {
        rb = RED_BLOCK;
    }
    nblk = (nred + rb - 1) / rb;
    double *part = res;
    if (nblk > 1 && !(part = malloc((size_t)(nblk * nout) * sizeof(double))))
        return ct_error_set(CT_ERR_NOMEM, "reduce: out of memory for %lld partial results", (long long)(nblk * nout));
    const int64_t ntask = outer ? (nout / J) * ncb * nblk : nout * nblk;
    const bool par = nout * nred > PAR_MIN;
    #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (par)
    for (int64_t t = 0; t < ntask; t++) {
        const int64_t b = t % nblk, r0 = b * rb, r1 = r0 + rb < nred ? r0 + rb : nred;
        if (outer) {
            const int64_t cb = (t / nblk) % ncb, ko = t / nblk / ncb, c0 = cb * OUTER_COLS;
            const int64_t nc = J - c0 < OUTER_COLS ? J - c0 : OUTER_COLS, o0 = ko * J + c0;
            const double *mp = mean ? mean + o0 : NULL;
            double *dst = part + b * nout + o0;
            if (dt == CT_DTYPE_F32) outer_task_float(pl, m, dt, xd, ko, c0, nc, r0, r1, mp, dst);
            else if (dt == CT_DTYPE_F64) outer_task_double(pl, m, dt, xd, ko, c0, nc, r0, r1, mp, dst);
            else outer_task_half(pl, m, dt, xd, ko, c0, nc, r0, r1, mp, dst);
        } else {
            const int64_t o = t / nblk;
            const double mo = mean ? mean[o] : 0.0;
            double v;
            if (dt == CT_DTYPE_F32) v = inner_task_float(pl, m, dt, xd, o, r0, r1, mo);
            else if (dt == CT_DTYPE_F64) v = inner_task_double(pl, m, dt, xd, o, r0, r1, mo);
            else v = inner_task_half(pl, m, dt, xd, o, r0, r1, mo);
            part[b * nout + o] = v;
        }
    }
    if (part != res) {
        #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (nout * nblk > PAR_MIN)
        for (int64_t o = 0; o < nout; o++) {
            double a = part[o];
            for (int64_t b = 1; b < nblk; b++) a = combine(m, a, part[b * nout + o]);
            res[o] = a;
        }
        free(part);
    }
    return CT_OK;
}

/* ---- integer kernels: exact, so any order gives the same bits ----------------------------- */

#define DEF_INT_KERNEL(NAME, T)                                                                    \
    static int64_t NAME(const cti_red_plan *pl, red_mode m, const T *x, int64_t o)                     \
    {                                                                                              \
        const int nr = pl->nr;                                                                     \
        const int64_t L = nr ? pl->rshape[nr - 1] : 1, ls = nr ? pl->rstride[nr - 1] : 0;          \
        const T *base = x + flat_offset(pl->nk, pl->kshape, pl->kstride, o, NULL);                 \
        int64_t idx[CT_MAX_DIMS] = {0}, roff = 0;                                                  \
        uint64_t sum = 0;                                                                          \
        int64_t ext = base[0];                                                                     \
        for (int64_t row = 0, nrow = pl->nred / L; row < nrow; row++) {                            \
            const T *p = base + roff;                                                              \
            if (m == M_SUM) {                                                                      \
                for (int64_t i = 0; i < L; i++) sum += (uint64_t)(int64_t)p[i * ls];               \
            } else if (m == M_MAX) {                                                               \
                for (int64_t i = 0; i < L; i++) ext = p[i * ls] > ext ? p[i * ls] : ext;           \
            } else {                                                                               \
                for (int64_t i = 0; i < L; i++) ext = p[i * ls] < ext ? p[i * ls] : ext;           \
            }                                                                                      \
            odometer_next(nr - 1, pl->rshape, pl->rstride, idx, &roff);                            \
        }                                                                                          \
        return m == M_SUM ? (int64_t)sum : ext;                                                    \
    }
DEF_INT_KERNEL(int_task_i32, int32_t)
DEF_INT_KERNEL(int_task_i64, int64_t)
DEF_INT_KERNEL(int_task_u8, uint8_t)

static void reduce_int(red_mode m, const ct_tensor *x, const cti_red_plan *pl, int64_t *res)
{
    const void *xd = ct_tensor_data(x);
    const ct_dtype dt = x->dtype;
    #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (pl->nout * pl->nred > PAR_MIN)
    for (int64_t o = 0; o < pl->nout; o++) {
        if (dt == CT_DTYPE_I32) res[o] = int_task_i32(pl, m, xd, o);
        else if (dt == CT_DTYPE_I64) res[o] = int_task_i64(pl, m, xd, o);
        else res[o] = int_task_u8(pl, m, xd, o); /* u8, bool */
    }
}

/* ---- entry points ----------------------------------------------------------------------- */

static bool is_int(ct_dtype dt)
{
    return dt == CT_DTYPE_I32 || dt == CT_DTYPE_I64 || dt == CT_DTYPE_U8 || dt == CT_DTYPE_BOOL;
}

/* argmax: x itself for f32/f64/integers, else an f32 copy in the current frame (exact). */
static const ct_tensor *widen(const ct_tensor *x)
{
    if (x->dtype == CT_DTYPE_F16 || x->dtype == CT_DTYPE_BF16) return ct_tensor_cast(x, CT_DTYPE_F32);
    return x;
}

/* The core shared by reduce and var: res[nout] in double (float inputs) or in
 * int64 (integers, returned through ires). */
static ct_status reduce_core(red_mode m, const ct_tensor *x, uint32_t mask, const double *mean, double *res,
                             int64_t *ires)
{
    cti_red_plan pl;
    cti_red_plan_init(&pl, x, mask);
    if (pl.nout == 0) return CT_OK;
    if (pl.nred == 0) { /* only SUM gets here: the empty sum */
        if (ires) memset(ires, 0, (size_t)pl.nout * sizeof *ires);
        else for (int64_t o = 0; o < pl.nout; o++) res[o] = 0.0;
        return CT_OK;
    }
    if (ires) {
        reduce_int(m, x, &pl, ires);
        return CT_OK;
    }
    return reduce_float(m, x, &pl, mean, res);
}

static ct_status store_result(ct_tensor *out, const double *res, const int64_t *ires, int64_t n)
{
    return ires ? ct_convert_n(out->dtype, ct_tensor_data(out), CT_DTYPE_I64, ires, n, false)
                : ct_convert_n(out->dtype, ct_tensor_data(out), CT_DTYPE_F64, res, n, false);
}

// x (...) -> out (kept dims); out = sum | mean | max | min over the dims in mask; out overwritten
ct_status cti_cpu_reduce(ct_reduce_op op, ct_tensor *out, const ct_tensor *x, uint32_t mask)
{
    const int64_t nout = ct_tensor_numel(out);
    if (nout == 0) return CT_OK;
    const bool integer = is_int(x->dtype);
    const red_mode m = op == CT_REDUCE_MAX ? M_MAX : op == CT_REDUCE_MIN ? M_MIN : M_SUM;
    ct_status st = CT_OK;
    double *res = integer ? NULL : malloc((size_t)nout * sizeof(double));
    int64_t *ires = integer ? malloc((size_t)nout * sizeof(int64_t)) : NULL;
    if (!res && !ires) {
        st = ct_error_set(CT_ERR_NOMEM, "reduce: out of memory for %lld results", (long long)nout);
    } else if (!(st = reduce_core(m, x, mask, NULL, res, ires))) {
        if (op == CT_REDUCE_MEAN) {
            const int64_t nred = ct_tensor_numel(x) / nout;
            for (int64_t o = 0; o < nout; o++) res[o] /= (double)nred;
        }
        st = store_result(out, res, ires, nout);
    }
    free(res);
    free(ires);
    return st;
}

// x (...) -> out (kept dims); out = sum((x - mean)^2) / (N - correction), two passes in double
ct_status cti_cpu_var(ct_tensor *out, const ct_tensor *x, uint32_t mask, int64_t correction)
{
    const int64_t nout = ct_tensor_numel(out);
    if (nout == 0) return CT_OK;
    const int64_t nred = ct_tensor_numel(x) / nout;
    ct_status st = CT_OK;
    double *mean = malloc((size_t)nout * sizeof(double)), *res = malloc((size_t)nout * sizeof(double));
    if (!mean || !res) {
        st = ct_error_set(CT_ERR_NOMEM, "var: out of memory for %lld results", (long long)nout);
    } else if (nred <= correction) {
        for (int64_t o = 0; o < nout; o++) res[o] = NAN;
        st = store_result(out, res, NULL, nout);
    } else if (!(st = reduce_core(M_SUM, x, mask, NULL, mean, NULL))) {
        for (int64_t o = 0; o < nout; o++) mean[o] /= (double)nred;
        if (!(st = reduce_core(M_SQDEV, x, mask, mean, res, NULL))) {
            for (int64_t o = 0; o < nout; o++) res[o] /= (double)(nred - correction);
            st = store_result(out, res, NULL, nout);
        }
    }
    free(mean);
    free(res);
    return st;
}

/* ---- argmax ------------------------------------------------------------------------------- */

#define IS_NAN_F(v) ((v) != (v))
#define IS_NAN_I(v) ((void)(v), false)
#define DEF_ARGMAX(NAME, T, ISNAN)                                                                 \
    static int64_t NAME(const T *p, int64_t s, int64_t n)                                          \
    {                                                                                              \
        T best = p[0];                                                                             \
        int64_t bi = 0;                                                                            \
        if (ISNAN(best)) return 0;                                                                 \
        for (int64_t i = 1; i < n; i++) {                                                          \
            T v = p[i * s];                                                                        \
            if (ISNAN(v)) return i;                                                                \
            if (v > best) best = v, bi = i;                                                        \
        }                                                                                          \
        return bi;                                                                                 \
    }
DEF_ARGMAX(argmax_f32, float, IS_NAN_F)
DEF_ARGMAX(argmax_f64, double, IS_NAN_F)
DEF_ARGMAX(argmax_i32, int32_t, IS_NAN_I)
DEF_ARGMAX(argmax_i64, int64_t, IS_NAN_I)
DEF_ARGMAX(argmax_u8, uint8_t, IS_NAN_I)

// x (...) -> out (I64, x's dims without dim); out = first index of the max (or of a NaN) along dim
ct_status cti_cpu_argmax(ct_tensor *out, const ct_tensor *x, int dim)
{
    ct_status st = CT_OK;
    ct_frame_push();
    const ct_tensor *xw = widen(x);
    if (!xw) {
        st = ct_last_status();
    } else {
        cti_red_plan pl;
        cti_red_plan_init(&pl, xw, x->ndim ? 1u << dim : 0u);
        const int64_t n = pl.nr ? pl.rshape[0] : 1, s = pl.nr ? pl.rstride[0] : 0;
        const size_t es = ct_dtype_size(xw->dtype);
        const char *xd = ct_tensor_data(xw);
        int64_t *o = ct_tensor_data(out);
        #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (pl.nout * n > PAR_MIN)
        for (int64_t i = 0; i < pl.nout; i++) {
            const char *p = xd + flat_offset(pl.nk, pl.kshape, pl.kstride, i, NULL) * (int64_t)es;
            switch (xw->dtype) {
            case CT_DTYPE_F32: o[i] = argmax_f32((const float *)p, s, n); break;
            case CT_DTYPE_F64: o[i] = argmax_f64((const double *)p, s, n); break;
            case CT_DTYPE_I32: o[i] = argmax_i32((const int32_t *)p, s, n); break;
            case CT_DTYPE_I64: o[i] = argmax_i64((const int64_t *)p, s, n); break;
            default: o[i] = argmax_u8((const uint8_t *)p, s, n); break;
            }
        }
    }
    ct_frame_pop();
    return st;
}

/* ---- references ---------------------------------------------------------------------------- */

typedef struct ref_dims {
    int nk, nr, kd[CT_MAX_DIMS], rd[CT_MAX_DIMS];
    int64_t nout, nred;
} ref_dims;

static void ref_dims_init(ref_dims *r, const ct_tensor *x, uint32_t mask)
{
    memset(r, 0, sizeof *r);
    r->nout = r->nred = 1;
    for (int d = 0; d < x->ndim; d++) {
        if ((mask >> d) & 1) r->rd[r->nr++] = d, r->nred *= x->shape[d];
        else r->kd[r->nk++] = d, r->nout *= x->shape[d];
    }
}

/* Writes flat index i over the listed dims of x into idx (other entries untouched). */
static void ref_set_index(const ct_tensor *x, int n, const int *dims, int64_t i, int64_t *idx)
{
    for (int k = n - 1; k >= 0; k--) {
        idx[dims[k]] = i % x->shape[dims[k]];
        i /= x->shape[dims[k]];
    }
}

static double ref_load(const ct_tensor *x, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < x->ndim; d++) off += idx[d] * x->strides[d];
    return ct_scalar_load(x->dtype, (const char *)ct_tensor_data(x) + off * (int64_t)ct_dtype_size(x->dtype));
}

static void ref_store(ct_tensor *out, int64_t o, double v)
{
    ct_scalar_store(out->dtype, (char *)ct_tensor_data(out) + o * (int64_t)ct_dtype_size(out->dtype), v);
}

ct_status cti_cpu_reduce_ref(ct_reduce_op op, ct_tensor *out, const ct_tensor *x, uint32_t mask)
{
    ref_dims r;
    ref_dims_init(&r, x, mask);
    int64_t idx[CT_MAX_DIMS] = {0};
    for (int64_t o = 0; o < r.nout; o++) {
        ref_set_index(x, r.nk, r.kd, o, idx);
        double acc = op == CT_REDUCE_SUM || op == CT_REDUCE_MEAN ? 0.0 : NAN;
        int64_t iacc = 0;
        for (int64_t j = 0; j < r.nred; j++) {
            ref_set_index(x, r.nr, r.rd, j, idx);
            double v = ref_load(x, idx);
            if (op == CT_REDUCE_SUM || op == CT_REDUCE_MEAN) {
                acc += v;
                iacc += (int64_t)v;
            } else if (j == 0 || isnan(v) || isnan(acc)) {
                acc = j == 0 || isnan(v) ? v : acc;
            } else {
                acc = op == CT_REDUCE_MAX ? fmax(acc, v) : fmin(acc, v);
            }
        }
        if (op == CT_REDUCE_MEAN) acc /= (double)r.nred;
        ref_store(out, o, is_int(x->dtype) && op == CT_REDUCE_SUM ? (double)iacc : acc);
    }
    return CT_OK;
}

ct_status cti_cpu_var_ref(ct_tensor *out, const ct_tensor *x, uint32_t mask, int64_t correction)
{
    ref_dims r;
    ref_dims_init(&r, x, mask);
    int64_t idx[CT_MAX_DIMS] = {0};
    for (int64_t o = 0; o < r.nout; o++) {
        ref_set_index(x, r.nk, r.kd, o, idx);
        double mean = 0, ss = 0;
        for (int64_t j = 0; j < r.nred; j++) {
            ref_set_index(x, r.nr, r.rd, j, idx);
            mean += ref_load(x, idx);
        }
        mean /= (double)r.nred;
        for (int64_t j = 0; j < r.nred; j++) {
            ref_set_index(x, r.nr, r.rd, j, idx);
            double d = ref_load(x, idx) - mean;
            ss += d * d;
        }
        ref_store(out, o, r.nred > correction ? ss / (double)(r.nred - correction) : NAN);
    }
    return CT_OK;
}

ct_status cti_cpu_argmax_ref(ct_tensor *out, const ct_tensor *x, int dim)
{
    ref_dims r;
    ref_dims_init(&r, x, x->ndim ? 1u << dim : 0u);
    int64_t idx[CT_MAX_DIMS] = {0};
    for (int64_t o = 0; o < r.nout; o++) {
        ref_set_index(x, r.nk, r.kd, o, idx);
        int64_t best = 0;
        double bv = NAN;
        for (int64_t j = 0; j < r.nred; j++) {
            ref_set_index(x, r.nr, r.rd, j, idx);
            double v = ref_load(x, idx);
            if (isnan(v)) {
                best = j;
                break;
            }
            if (j == 0 || v > bv) bv = v, best = j;
        }
        ((int64_t *)ct_tensor_data(out))[o] = best;
    }
    return CT_OK;
}
