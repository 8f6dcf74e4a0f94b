/* ctrain — what the CUDA elementwise files share (kernels/cuda/binary.cu, unary.cu;
 * reduce.cu uses the element access and the dtype switch too): element access for
 * every dtype the elementwise ops take, the dtype switch over them, and the index
 * calculator that maps an output's flat index to each operand's element offset.
 *
 * Index calculator. An op over operands 0..nops (0 is the output) is described by
 * the output's shape and each operand's strides broadcast to it (0 on stretched
 * and new dims). cti_ew_geom_init drops size-1 dims and merges a dim into the one
 * outside it wherever every operand's strides allow (outer stride == inner stride
 * * inner size), so a contiguous same-shape op becomes one flat dim and
 * "(N, C) + (C,)" two dims. A thread unravels its flat index over the folded
 * shape (row-major, int64) and sums index * stride per operand; when the folded
 * op is one dim with every stride 1 (cti_ew_geom_flat) the offset is the index.
 *
 * The reference kernels use cti_ew_ref instead: each operand's own shape and
 * strides and numpy's rule written out (a size-1 dim reads index 0), as
 * kernels/cpu/elementwise.c's references do. */
#ifndef CT_KERNELS_CUDA_ELEMENTWISE_CUH
#define CT_KERNELS_CUDA_ELEMENTWISE_CUH

#include "kernels/cuda/common.cuh"

extern "C" {
#include "kernels/dispatch_internal.h"
}

/* ---- element access ------------------------------------------------------------------- */

/* The compute type of a storage type: f32 for f32/f16/bf16, itself otherwise. */
template <typename T> struct cti_ew_c { typedef T type; };
template <> struct cti_ew_c<cti_bf16> { typedef float type; };
template <> struct cti_ew_c<cti_f16> { typedef float type; };

/* Integer storage types (integer math with wrap-around, no rounding). */
template <typename T> struct cti_ew_is_int { static const bool value = false; };
template <> struct cti_ew_is_int<int32_t> { static const bool value = true; };
template <> struct cti_ew_is_int<int64_t> { static const bool value = true; };
template <> struct cti_ew_is_int<uint8_t> { static const bool value = true; };

__device__ __forceinline__ float cti_ew_ld(const float *p) { return *p; }
__device__ __forceinline__ double cti_ew_ld(const double *p) { return *p; }
__device__ __forceinline__ float cti_ew_ld(const cti_bf16 *p) { return ld(p); }
__device__ __forceinline__ float cti_ew_ld(const cti_f16 *p) { return ld(p); }
__device__ __forceinline__ int32_t cti_ew_ld(const int32_t *p) { return *p; }
__device__ __forceinline__ int64_t cti_ew_ld(const int64_t *p) { return *p; }
__device__ __forceinline__ uint8_t cti_ew_ld(const uint8_t *p) { return *p; }

__device__ __forceinline__ void cti_ew_st(float *p, float v) { *p = v; }
__device__ __forceinline__ void cti_ew_st(double *p, double v) { *p = v; }
__device__ __forceinline__ void cti_ew_st(cti_bf16 *p, float v) { st(p, v); }
__device__ __forceinline__ void cti_ew_st(cti_f16 *p, float v) { st(p, v); }
__device__ __forceinline__ void cti_ew_st(int32_t *p, int32_t v) { *p = v; }
__device__ __forceinline__ void cti_ew_st(int64_t *p, int64_t v) { *p = v; }
__device__ __forceinline__ void cti_ew_st(uint8_t *p, uint8_t v) { *p = v; }

/* A double rounded once to a float storage type (the references' store, with the
 * bits ct_scalar_store gives: f16/bf16 round from the double directly). */
__device__ __forceinline__ void cti_ew_st_f64(float *p, double v) { *p = (float)v; }
__device__ __forceinline__ void cti_ew_st_f64(double *p, double v) { *p = v; }
__device__ __forceinline__ void cti_ew_st_f64(cti_bf16 *p, double v) { p->bits = cti_f64_to_bf16_bits(v); }
__device__ __forceinline__ void cti_ew_st_f64(cti_f16 *p, double v) { p->bits = cti_f64_to_f16_bits(v); }

/* Runs the statements with T the storage type of any dtype the elementwise ops
 * take (bool is stored as uint8_t 0/1); fp8 falls to the caller's else. */
#define CTI_EW_DISPATCH(dt, T, ...)                                            \
    CTI_CU_DISPATCH_FLOAT(dt, T, __VA_ARGS__)                                  \
    else if ((dt) == CT_DTYPE_I32) {                                           \
        typedef int32_t T;                                                     \
        __VA_ARGS__                                                            \
    } else if ((dt) == CT_DTYPE_I64) {                                         \
        typedef int64_t T;                                                     \
        __VA_ARGS__                                                            \
    } else if ((dt) == CT_DTYPE_U8 || (dt) == CT_DTYPE_BOOL) {                 \
        typedef uint8_t T;                                                     \
        __VA_ARGS__                                                            \
    }

/* ---- vector access for contiguous operands ----------------------------------------------- */

/* V consecutive elements of T moved as one aligned access (16 bytes for the
 * inputs: 4 f32, 8 bf16, 16 u8; a comparison's BOOL output gets V bytes). */
template <typename T, int V> struct alignas(sizeof(T) * V) cti_ew_vec { T v[V]; };
template <typename T> struct cti_ew_width { static const int value = 16 / (int)sizeof(T); };

/* p is aligned for vectors of V elements of `size` bytes. */
static inline bool cti_ew_aligned(const void *p, int V, size_t size)
{
    return (uintptr_t)p % ((uintptr_t)V * size) == 0;
}

/* ---- the fast kernels' index calculator ------------------------------------------------- */

enum { CTI_EW_MAX_OPS = 4, CTI_EW_THREADS = 256 };

typedef struct cti_ew_geom {
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t st[CTI_EW_MAX_OPS][CT_MAX_DIMS];
} cti_ew_geom;

/* Strides (elements) of t broadcast to an ndim-d shape: 0 on new and stretched dims. */
static inline void cti_ew_bcast_strides(const ct_tensor *t, int ndim, const int64_t *shape, int64_t *st)
{
    const int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++)
        st[d] = d < lead || (t->shape[d - lead] == 1 && shape[d] != 1) ? 0 : t->strides[d - lead];
}

/* Folds (ndim, shape) with nops operands' strides st[k] (unused operands: zeros). */
static inline void cti_ew_geom_init(cti_ew_geom *g, int ndim, const int64_t *shape, int nops,
                                    const int64_t (*st)[CT_MAX_DIMS])
{
    memset(g, 0, sizeof *g);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (g->ndim > 0) {
            const int p = g->ndim - 1;
            bool merge = true;
            for (int k = 0; k < nops; k++) merge = merge && g->st[k][p] == st[k][d] * shape[d];
            if (merge) {
                g->shape[p] *= shape[d];
                for (int k = 0; k < nops; k++) g->st[k][p] = st[k][d];
                continue;
            }
        }
        g->shape[g->ndim] = shape[d];
        for (int k = 0; k < nops; k++) g->st[k][g->ndim] = st[k][d];
        g->ndim++;
    }
}

/* Every operand reads and writes element i at offset i. */
static inline bool cti_ew_geom_flat(const cti_ew_geom *g, int nops)
{
    if (g->ndim == 0) return true;
    if (g->ndim > 1) return false;
    for (int k = 0; k < nops; k++)
        if (g->st[k][0] != 1) return false;
    return true;
}

/* i / d for i >= 0, d > 0: in 32 bits when both fit (a 64-bit division is a long
 * software sequence on the GPU, and most tensors index below 2^32). */
__device__ __forceinline__ int64_t cti_ew_div(int64_t i, int64_t d)
{
    return ((uint64_t)(i | d) >> 32) == 0 ? (int64_t)((uint32_t)i / (uint32_t)d) : i / d;
}

/* off[k] = operand k's element offset for output flat index i. The dims are
 * walked with constant indices so the geometry stays in parameter space. */
template <int NOPS> __device__ __forceinline__ void cti_ew_offsets(const cti_ew_geom &g, int64_t i, int64_t *off)
{
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] = 0;
#pragma unroll
    for (int d = CT_MAX_DIMS - 1; d >= 0; d--) {
        if (d < g.ndim) {
            const int64_t q = cti_ew_div(i, g.shape[d]), r = i - q * g.shape[d];
            i = q;
#pragma unroll
            for (int k = 0; k < NOPS; k++) off[k] += r * g.st[k][d];
        }
    }
}

/* ---- the references' indexing -------------------------------------------------------------- */

typedef struct cti_ew_ref_operand {
    int ndim;
    int64_t shape[CT_MAX_DIMS], strides[CT_MAX_DIMS];
} cti_ew_ref_operand;

/* The output's shape and up to four operands as they are (t[0] is the output). */
typedef struct cti_ew_ref {
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    cti_ew_ref_operand t[CTI_EW_MAX_OPS];
} cti_ew_ref;

static inline void cti_ew_ref_init(cti_ew_ref *r, const ct_tensor *out, const ct_tensor *const *ops, int nops)
{
    memset(r, 0, sizeof *r);
    r->ndim = out->ndim;
    memcpy(r->shape, out->shape, sizeof r->shape);
    for (int k = 0; k < nops; k++) {
        if (!ops[k]) continue;
        r->t[k].ndim = ops[k]->ndim;
        memcpy(r->t[k].shape, ops[k]->shape, sizeof r->t[k].shape);
        memcpy(r->t[k].strides, ops[k]->strides, sizeof r->t[k].strides);
    }
}

/* Multi-index of flat output index i (row-major). */
__device__ __forceinline__ void cti_ew_ref_unravel(const cti_ew_ref &r, int64_t i, int64_t *idx)
{
    for (int d = r.ndim - 1; d >= 0; d--) {
        idx[d] = i % r.shape[d];
        i /= r.shape[d];
    }
}

/* Element offset of operand k at output multi-index idx: dims align at the right,
 * a size-1 dim reads index 0. */
__device__ __forceinline__ int64_t cti_ew_ref_offset(const cti_ew_ref &r, int k, const int64_t *idx)
{
    const cti_ew_ref_operand &t = r.t[k];
    const int lead = r.ndim - t.ndim;
    int64_t off = 0;
    for (int d = 0; d < t.ndim; d++) off += (t.shape[d] == 1 ? 0 : idx[d + lead]) * t.strides[d];
    return off;
}

#endif
