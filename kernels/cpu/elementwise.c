/* CPU elementwise: the row driver and low-precision row helpers shared by
 * binary.c and unary.c, and the reference kernels every fast path is tested
 * against.
 *
 * The references take one element at a time: the output's flat index is
 * unravelled into a multi-index, each input's element is found from it with
 * numpy's broadcasting rule written out directly (core/iter_internal.h is not used),
 * loaded as a double by ct_scalar_load, computed in double (integer ops in
 * int64 with wrap-around) and stored once. */
#include "kernels/cpu/elementwise.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/convert.h"
#include "core/iter_internal.h"
#include "core/threads.h"

/* ---- shared helpers ---------------------------------------------------------- */

void cti_cpu_ew_bcast_strides(const ct_tensor *t, int ndim, const int64_t *shape, int64_t *strides)
{
    int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        if (d < lead || (t->shape[d - lead] == 1 && shape[d] != 1)) strides[d] = 0;
        else strides[d] = t->strides[d - lead];
    }
}

/* Advances a row multi-index (the iterator's outer dims) by one, keeping every
 * operand's element offset in step; cheaper than cti_iter_row's divisions when
 * rows are short. */
static void row_next(const ct_iter *it, int64_t *idx, int64_t *offs)
{
    for (int d = it->ndim - 1; d >= 0; d--) {
        idx[d]++;
        for (int k = 0; k < it->nops; k++) offs[k] += it->strides[k][d];
        if (idx[d] < it->shape[d]) return;
        for (int k = 0; k < it->nops; k++) offs[k] -= it->shape[d] * it->strides[k][d];
        idx[d] = 0;
    }
}

void cti_cpu_ew_run(int ndim, const int64_t *shape, int nops, char *const *base, const int64_t *const *strides,
                    const size_t *esize, ct_cpu_ew_row_fn fn, const void *ctx)
{
    ct_iter it;
    cti_iter_init(&it, ndim, shape, nops, strides);
    if (it.nrows == 0 || it.inner == 0) return;
    /* Tasks are pieces of rows, so one long contiguous row still splits across
     * threads and a piece stays small enough for stack scratch buffers. */
    const int64_t npiece = (it.inner + CT_CPU_EW_PIECE - 1) / CT_CPU_EW_PIECE;
    const int64_t ntask = it.nrows * npiece;
    const int64_t work = it.nrows * it.inner;
    int nthreads = work > 32768 ? ct_get_num_threads() : 1;
    if (nthreads > ntask) nthreads = (int)ntask;
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t t0 = ntask * tid / nth, t1 = ntask * (tid + 1) / nth;
        if (t0 < t1) {
            int64_t row = t0 / npiece, piece = t0 - row * npiece;
            int64_t idx[CT_MAX_DIMS] = {0}, offs[CT_ITER_MAX_OPS];
            cti_iter_row(&it, row, offs);
            for (int64_t r = row, d = it.ndim - 1; d >= 0; d--) {
                idx[d] = r % it.shape[d];
                r /= it.shape[d];
            }
            for (int64_t t = t0; t < t1; t++) {
                const int64_t c0 = piece * CT_CPU_EW_PIECE;
                const int64_t n = it.inner - c0 < CT_CPU_EW_PIECE ? it.inner - c0 : CT_CPU_EW_PIECE;
                char *p[CT_ITER_MAX_OPS];
                for (int k = 0; k < nops; k++)
                    p[k] = base[k] + (offs[k] + c0 * it.inner_stride[k]) * (int64_t)esize[k];
                fn(ctx, p, it.inner_stride, n);
                if (++piece == npiece) {
                    piece = 0;
                    row_next(&it, idx, offs);
                }
            }
        }
    }
}

void cti_cpu_ew_load_f32(ct_dtype dt, const char *p, int64_t s, int64_t n, float *dst)
{
    if (s == 1) {
        ct_convert_n(CT_DTYPE_F32, dst, dt, p, n, false);
        return;
    }
    const size_t es = ct_dtype_size(dt);
    if (s == 0) {
        float v;
        ct_convert_n(CT_DTYPE_F32, &v, dt, p, 1, false);
        for (int64_t i = 0; i < n; i++) dst[i] = v;
        return;
    }
    switch (dt) {
    case CT_DTYPE_F32:
        for (int64_t i = 0; i < n; i++) memcpy(&dst[i], p + i * s * (int64_t)es, sizeof(float));
        break;
    case CT_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = ct_f16_to_f32(*(const uint16_t *)(p + i * s * 2));
        break;
    case CT_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = ct_bf16_to_f32(*(const uint16_t *)(p + i * s * 2));
        break;
    default:
        for (int64_t i = 0; i < n; i++) ct_convert_n(CT_DTYPE_F32, &dst[i], dt, p + i * s * (int64_t)es, 1, false);
    }
}

void cti_cpu_ew_store_f32(ct_dtype dt, char *p, int64_t s, int64_t n, const float *src)
{
    if (s == 1) {
        ct_convert_n(dt, p, CT_DTYPE_F32, src, n, false);
        return;
    }
    const size_t es = ct_dtype_size(dt);
    switch (dt) {
    case CT_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) *(uint16_t *)(p + i * s * 2) = ct_f32_to_f16(src[i]);
        break;
    case CT_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) *(uint16_t *)(p + i * s * 2) = ct_f32_to_bf16(src[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) ct_convert_n(dt, p + i * s * (int64_t)es, CT_DTYPE_F32, &src[i], 1, false);
    }
}

/* ---- references: indexing ------------------------------------------------------ */

/* Pointer to the element of t that broadcasting maps the output multi-index idx
 * (ndim entries) to: t's dims align at the right, a size-1 dim reads index 0. */
static char *ref_elem(const ct_tensor *t, int ndim, const int64_t *idx)
{
    int lead = ndim - t->ndim;
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) {
        int64_t i = t->shape[d] == 1 ? 0 : idx[d + lead];
        off += i * t->strides[d];
    }
    return (char *)ct_tensor_data(t) + off * (int64_t)ct_dtype_size(t->dtype);
}

/* Multi-index of flat position i in a row-major ndim-d shape. */
static void ref_unravel(int64_t i, int ndim, const int64_t *shape, int64_t *idx)
{
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
}

static bool ref_is_int(ct_dtype dt)
{
    return dt == CT_DTYPE_I32 || dt == CT_DTYPE_I64 || dt == CT_DTYPE_U8 || dt == CT_DTYPE_BOOL;
}

/* Integers are read and written directly (a double cannot hold every i64), and
 * stored with a C cast's wrap-around. */
static int64_t ref_load_int(ct_dtype dt, const char *p)
{
    switch (dt) {
    case CT_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case CT_DTYPE_I64: { int64_t v; memcpy(&v, p, 8); return v; }
    default: return (uint8_t)*p;
    }
}

static void ref_store_int(ct_dtype dt, char *p, int64_t v)
{
    switch (dt) {
    case CT_DTYPE_I32: { int32_t w = (int32_t)(uint32_t)(uint64_t)v; memcpy(p, &w, 4); break; }
    case CT_DTYPE_I64: memcpy(p, &v, 8); break;
    case CT_DTYPE_BOOL: *p = v != 0; break;
    default: *p = (char)(uint8_t)(uint64_t)v;
    }
}

/* ---- references: math ------------------------------------------------------------ */

static bool ref_compare(ct_binary_op op, double x, double y)
{
    switch (op) {
    case CT_BINARY_EQ: return x == y;
    case CT_BINARY_NE: return x != y;
    case CT_BINARY_LT: return x < y;
    case CT_BINARY_LE: return x <= y;
    case CT_BINARY_GT: return x > y;
    default: return x >= y;
    }
}

static double ref_binary_f(ct_binary_op op, double x, double y)
{
    switch (op) {
    case CT_BINARY_ADD: return x + y;
    case CT_BINARY_SUB: return x - y;
    case CT_BINARY_MUL: return x * y;
    case CT_BINARY_DIV: return x / y;
    case CT_BINARY_POW: return pow(x, y);
    case CT_BINARY_MAX: return isnan(x) || isnan(y) ? NAN : (x > y ? x : y);
    case CT_BINARY_MIN: return isnan(x) || isnan(y) ? NAN : (x < y ? x : y);
    default: return ref_compare(op, x, y);
    }
}

static int64_t ref_binary_i(ct_binary_op op, int64_t x, int64_t y)
{
    switch (op) {
    case CT_BINARY_ADD: return (int64_t)((uint64_t)x + (uint64_t)y);
    case CT_BINARY_SUB: return (int64_t)((uint64_t)x - (uint64_t)y);
    case CT_BINARY_MUL: return (int64_t)((uint64_t)x * (uint64_t)y);
    case CT_BINARY_MAX: return x > y ? x : y;
    case CT_BINARY_MIN: return x < y ? x : y;
    default: return ref_compare(op, (double)x, (double)y);
    }
}

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static double ref_unary_f(ct_unary_op op, double x)
{
    const double k = sqrt(2.0 / M_PI);
    switch (op) {
    case CT_UNARY_NEG: return -x;
    case CT_UNARY_ABS: return fabs(x);
    case CT_UNARY_EXP: return exp(x);
    case CT_UNARY_LOG: return log(x);
    case CT_UNARY_SQRT: return sqrt(x);
    case CT_UNARY_RSQRT: return 1.0 / sqrt(x);
    case CT_UNARY_TANH: return tanh(x);
    case CT_UNARY_SIGMOID: return ref_sigmoid(x);
    case CT_UNARY_RELU: return x < 0 ? 0.0 : x;
    case CT_UNARY_GELU_TANH: return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    case CT_UNARY_GELU_ERF: return 0.5 * x * (1.0 + erf(x / M_SQRT2));
    default: return x * ref_sigmoid(x);
    }
}

static int64_t ref_unary_i(ct_unary_op op, int64_t x)
{
    switch (op) {
    case CT_UNARY_NEG: return (int64_t)(0 - (uint64_t)x);
    case CT_UNARY_ABS: return x < 0 ? (int64_t)(0 - (uint64_t)x) : x;
    default: return x < 0 ? 0 : x; /* RELU */
    }
}

/* f'(x); y = f(x) when the caller has it (NAN otherwise). */
static double ref_derivative(ct_unary_op op, double x, double y, bool have_y)
{
    const double k = sqrt(2.0 / M_PI), c = 0.044715;
    switch (op) {
    case CT_UNARY_NEG: return -1.0;
    case CT_UNARY_ABS: return (double)((x > 0) - (x < 0)); /* sign; 0 at 0 and for NaN */
    case CT_UNARY_EXP: return have_y ? y : exp(x);
    case CT_UNARY_LOG: return 1.0 / x;
    case CT_UNARY_SQRT: return 0.5 / sqrt(x);
    case CT_UNARY_RSQRT: return -0.5 / (x * sqrt(x));
    case CT_UNARY_TANH: {
        double t = have_y ? y : tanh(x);
        return 1.0 - t * t;
    }
    case CT_UNARY_SIGMOID: {
        double s = have_y ? y : ref_sigmoid(x);
        return s * (1.0 - s);
    }
    case CT_UNARY_RELU: return x <= 0 ? 0.0 : 1.0;
    case CT_UNARY_GELU_TANH: {
        double t = tanh(k * (x + c * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
    }
    case CT_UNARY_GELU_ERF: return 0.5 * (1.0 + erf(x / M_SQRT2)) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
    default: {
        double s = ref_sigmoid(x);
        return s * (1.0 + x * (1.0 - s));
    }
    }
}

/* ---- references: kernels ----------------------------------------------------------- */

ct_status cti_cpu_binary_ref(ct_binary_op op, ct_tensor *out, const ct_tensor *a, const ct_tensor *b)
{
    const int64_t n = ct_tensor_numel(out);
    int64_t idx[CT_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, out->ndim, out->shape, idx);
        const char *pa = ref_elem(a, out->ndim, idx), *pb = ref_elem(b, out->ndim, idx);
        char *po = ref_elem(out, out->ndim, idx);
        if (ref_is_int(a->dtype))
            ref_store_int(out->dtype, po, ref_binary_i(op, ref_load_int(a->dtype, pa), ref_load_int(b->dtype, pb)));
        else
            ct_scalar_store(out->dtype, po,
                            ref_binary_f(op, ct_scalar_load(a->dtype, pa), ct_scalar_load(b->dtype, pb)));
    }
    return CT_OK;
}

ct_status cti_cpu_binary_scalar_ref(ct_binary_op op, ct_tensor *out, const ct_tensor *a, double s, bool reversed)
{
    const int64_t n = ct_tensor_numel(out);
    int64_t idx[CT_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, out->ndim, out->shape, idx);
        const char *pa = ref_elem(a, out->ndim, idx);
        char *po = ref_elem(out, out->ndim, idx);
        if (ref_is_int(a->dtype)) {
            int64_t x = ref_load_int(a->dtype, pa), y = (int64_t)s;
            ref_store_int(out->dtype, po, reversed ? ref_binary_i(op, y, x) : ref_binary_i(op, x, y));
        } else {
            /* the scalar takes the compute type's precision, as the fast kernel documents */
            double x = ct_scalar_load(a->dtype, pa), y = a->dtype == CT_DTYPE_F64 ? s : (double)(float)s;
            ct_scalar_store(out->dtype, po, reversed ? ref_binary_f(op, y, x) : ref_binary_f(op, x, y));
        }
    }
    return CT_OK;
}

ct_status cti_cpu_where_ref(ct_tensor *out, const ct_tensor *cond, const ct_tensor *a, const ct_tensor *b)
{
    const int64_t n = ct_tensor_numel(out);
    const size_t es = ct_dtype_size(out->dtype);
    int64_t idx[CT_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, out->ndim, out->shape, idx);
        bool c = *ref_elem(cond, out->ndim, idx) != 0;
        memcpy(ref_elem(out, out->ndim, idx), ref_elem(c ? a : b, out->ndim, idx), es);
    }
    return CT_OK;
}

ct_status cti_cpu_unary_ref(ct_unary_op op, ct_tensor *out, const ct_tensor *x)
{
    const int64_t n = ct_tensor_numel(out);
    int64_t idx[CT_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, out->ndim, out->shape, idx);
        const char *px = ref_elem(x, out->ndim, idx);
        char *po = ref_elem(out, out->ndim, idx);
        if (ref_is_int(x->dtype)) ref_store_int(out->dtype, po, ref_unary_i(op, ref_load_int(x->dtype, px)));
        else ct_scalar_store(out->dtype, po, ref_unary_f(op, ct_scalar_load(x->dtype, px)));
    }
    return CT_OK;
}

ct_status cti_cpu_unary_backward_ref(ct_unary_op op, ct_tensor *gin, const ct_tensor *gout, const ct_tensor *x,
                                     const ct_tensor *y)
{
    const int64_t n = ct_tensor_numel(gin);
    int64_t idx[CT_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, gin->ndim, gin->shape, idx);
        double g = ct_scalar_load(gout->dtype, ref_elem(gout, gin->ndim, idx));
        double xv = x ? ct_scalar_load(x->dtype, ref_elem(x, gin->ndim, idx)) : NAN;
        double yv = y ? ct_scalar_load(y->dtype, ref_elem(y, gin->ndim, idx)) : NAN;
        ct_scalar_store(gin->dtype, ref_elem(gin, gin->ndim, idx), g * ref_derivative(op, xv, yv, y != NULL));
    }
    return CT_OK;
}
