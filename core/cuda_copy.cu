/* Copies, casts and fills of tensors on a GPU (core/copy.c calls these for GPU
 * tensors), with the conversion rules of core/convert.h bit for bit:
 *   float -> float  the source widened exactly to f64, then rounded once to the
 *                   target (the same bits as rounding from the source directly);
 *   float -> int    truncate toward zero, saturate, NaN -> 0;
 *   int -> int      two's complement wrap, as a C cast;
 *   int -> float    i64 through f64 rounded to odd (one rounding in all);
 * (the scalar conversions are core/convert_bits.h's, the CPU's own);
 *   any -> bool     nonzero (NaN included) -> 1.
 * Same-dtype contiguous copies are plain cudaMemcpyAsync; everything else is one
 * kernel over the destination's elements with a per-element offset calculation
 * (up to CT_MAX_DIMS dims, 64-bit). */
#include "kernels/cuda/common.cuh"

namespace {

struct strided_geom {
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t dst_strides[CT_MAX_DIMS];
    int64_t src_strides[CT_MAX_DIMS];
};

__device__ bool is_int(ct_dtype dt)
{
    return dt == CT_DTYPE_I32 || dt == CT_DTYPE_I64 || dt == CT_DTYPE_U8 || dt == CT_DTYPE_BOOL;
}

__device__ int64_t load_int(ct_dtype dt, const char *p)
{
    switch (dt) {
    case CT_DTYPE_I32: return *(const int32_t *)p;
    case CT_DTYPE_I64: return *(const int64_t *)p;
    case CT_DTYPE_U8: return *(const uint8_t *)p;
    case CT_DTYPE_BOOL: return *(const uint8_t *)p != 0;
    default: return 0;
    }
}

__device__ void store_int(ct_dtype dt, char *p, int64_t v)
{
    switch (dt) {
    case CT_DTYPE_I32: *(int32_t *)p = (int32_t)v; break;
    case CT_DTYPE_I64: *(int64_t *)p = v; break;
    case CT_DTYPE_U8: *(uint8_t *)p = (uint8_t)v; break;
    case CT_DTYPE_BOOL: *(uint8_t *)p = v != 0; break;
    default: break;
    }
}

/* Any source as f64: exact for every float dtype and for i32/u8/bool; i64 rounded
 * to odd unless the target is f64 itself (then rounded to nearest, as the CPU). */
__device__ double load_f64(ct_dtype dt, const char *p, ct_dtype target)
{
    switch (dt) {
    case CT_DTYPE_F32: return *(const float *)p;
    case CT_DTYPE_F64: return *(const double *)p;
    case CT_DTYPE_F16: return cti_f16_bits_to_f32(*(const uint16_t *)p);
    case CT_DTYPE_BF16: return cti_bf16_bits_to_f32(*(const uint16_t *)p);
    case CT_DTYPE_F8_E4M3: return cti_e4m3_bits_to_f32(*(const uint8_t *)p);
    case CT_DTYPE_F8_E5M2: return cti_e5m2_bits_to_f32(*(const uint8_t *)p);
    case CT_DTYPE_I64: {
        int64_t v = *(const int64_t *)p;
        return target == CT_DTYPE_F64 ? (double)v : i64_to_f64_odd(v);
    }
    default: return (double)load_int(dt, p);
    }
}

__device__ void store_f64(ct_dtype dt, char *p, double v, bool sat)
{
    switch (dt) {
    case CT_DTYPE_F32: *(float *)p = (float)v; break;
    case CT_DTYPE_F64: *(double *)p = v; break;
    case CT_DTYPE_F16: *(uint16_t *)p = cti_f64_to_f16_bits(v); break;
    case CT_DTYPE_BF16: *(uint16_t *)p = cti_f64_to_bf16_bits(v); break;
    case CT_DTYPE_F8_E4M3: *(uint8_t *)p = cti_f64_to_e4m3_bits(v, sat); break;
    case CT_DTYPE_F8_E5M2: *(uint8_t *)p = cti_f64_to_e5m2_bits(v, sat); break;
    case CT_DTYPE_I32: *(int32_t *)p = f64_to_i32(v); break;
    case CT_DTYPE_I64: *(int64_t *)p = f64_to_i64(v); break;
    case CT_DTYPE_U8: *(uint8_t *)p = f64_to_u8(v); break;
    case CT_DTYPE_BOOL: *(uint8_t *)p = v != 0 || v != v; break;
    default: break;
    }
}

__device__ void convert_one(ct_dtype ddt, char *d, ct_dtype sdt, const char *s, int es, bool sat)
{
    if (ddt == sdt) {
        for (int b = 0; b < es; b++) d[b] = s[b];
    } else if (is_int(ddt) && is_int(sdt)) {
        store_int(ddt, d, load_int(sdt, s));
    } else {
        store_f64(ddt, d, load_f64(sdt, s, ddt), sat);
    }
}

__global__ void copy_strided_kernel(char *dst, ct_dtype ddt, int des, const char *src, ct_dtype sdt, int ses,
                                    strided_geom g, int64_t n, bool sat)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = i, doff = 0, soff = 0;
        for (int d = g.ndim - 1; d >= 0; d--) {
            int64_t idx = rem % g.shape[d];
            rem /= g.shape[d];
            doff += idx * g.dst_strides[d];
            soff += idx * g.src_strides[d];
        }
        convert_one(ddt, dst + doff * des, sdt, src + soff * ses, des, sat);
    }
}

__global__ void fill_kernel(char *dst, int es, strided_geom g, int64_t n, uint64_t bytes)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = i, off = 0;
        for (int d = g.ndim - 1; d >= 0; d--) {
            off += rem % g.shape[d] * g.dst_strides[d];
            rem /= g.shape[d];
        }
        char *p = dst + off * es;
        for (int b = 0; b < es; b++) p[b] = (char)(bytes >> (8 * b));
    }
}

/* Contiguous destination and source: the copy is one byte range. */
bool both_dense(const ct_tensor *dst, const int64_t *src_strides)
{
    int64_t expect = 1;
    for (int d = dst->ndim - 1; d >= 0; d--) {
        if (dst->shape[d] == 1) continue;
        if (dst->strides[d] != expect || src_strides[d] != expect) return false;
        expect *= dst->shape[d];
    }
    return true;
}

} // namespace

extern "C" ct_status cti_cuda_copy_strided(ct_tensor *dst, const ct_tensor *src, const int64_t *src_strides,
                                           bool saturate)
{
    int dev = dst->device.index;
    if (cti_cuda_enter(dev, "tensor_copy_")) return ct_last_status();
    cudaStream_t st = cti_cu_stream(dst);
    int64_t n = ct_tensor_numel(dst);
    if (n == 0) return CT_OK;
    char *dp = (char *)ct_tensor_data(dst);
    const char *sp = (const char *)ct_tensor_data(src);
    size_t des = ct_dtype_size(dst->dtype), ses = ct_dtype_size(src->dtype);
    if (dst->dtype == src->dtype && both_dense(dst, src_strides)) {
        cudaError_t e = src->device.index == dev
                            ? cudaMemcpyAsync(dp, sp, (size_t)n * des, cudaMemcpyDeviceToDevice, st)
                            : cudaMemcpyPeerAsync(dp, dev, sp, src->device.index, (size_t)n * des, st);
        char what[200];
        ct_tensor_describe(dst, what, sizeof what);
        if (cti_cuda_check(e, "tensor_copy_", dev, what)) return ct_last_status();
        cti_cuda_note_op("tensor_copy_", dev, what);
        return CT_OK;
    }
    if (src->device.index != dev) {
        char a[200], b[200];
        return ct_error_set(CT_ERR_INVALID, "tensor_copy_: a strided or converting copy between GPUs (%s <- %s) "
                                            "needs a contiguous same-dtype source",
                            ct_tensor_describe(dst, a, sizeof a), ct_tensor_describe(src, b, sizeof b));
    }
    strided_geom g;
    g.ndim = dst->ndim;
    for (int d = 0; d < dst->ndim; d++) {
        g.shape[d] = dst->shape[d];
        g.dst_strides[d] = dst->strides[d];
        g.src_strides[d] = src_strides[d];
    }
    copy_strided_kernel<<<cti_cu_blocks(n, 256), 256, 0, st>>>(dp, dst->dtype, (int)des, sp, src->dtype, (int)ses,
                                                                g, n, saturate);
    return cti_cuda_launched("tensor_copy_", dst);
}

extern "C" ct_status cti_cuda_fill(ct_tensor *t, double value)
{
    int dev = t->device.index;
    if (cti_cuda_enter(dev, "tensor_fill_")) return ct_last_status();
    int64_t n = ct_tensor_numel(t);
    if (n == 0) return CT_OK;
    unsigned char one[8] = {0};
    ct_scalar_store(t->dtype, one, value);
    size_t es = ct_dtype_size(t->dtype);
    uint64_t bytes = 0;
    bool zero = true;
    for (size_t b = 0; b < es; b++) {
        bytes |= (uint64_t)one[b] << (8 * b);
        zero = zero && one[b] == 0;
    }
    cudaStream_t st = cti_cu_stream(t);
    char *p = (char *)ct_tensor_data(t);
    if (zero && ct_tensor_is_contiguous(t)) {
        char what[200];
        ct_tensor_describe(t, what, sizeof what);
        return cti_cuda_check(cudaMemsetAsync(p, 0, (size_t)n * es, st), "tensor_fill_", dev, what);
    }
    strided_geom g;
    g.ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
        g.shape[d] = t->shape[d];
        g.dst_strides[d] = t->strides[d];
        g.src_strides[d] = 0;
    }
    fill_kernel<<<cti_cu_blocks(n, 256), 256, 0, st>>>(p, (int)es, g, n, bytes);
    return cti_cuda_launched("tensor_fill_", t);
}
