/* ctrain — CUDA fused AdamW/Adam and SGD (contract: kernels/cuda/optim.h, math:
 * kernels/optim.h).
 *
 * One pass per element over p, g and the state. Every arithmetic step is an
 * explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn and
 * their double forms) in the order kernels/cpu/optim.c evaluates its expressions,
 * because nvcc would otherwise contract a * b + c into one FMA and the bits would
 * differ from the CPU's (which is built without contraction, -std=c11).
 *
 * A launch updates up to OPT_LIST_MAX tensors: blockIdx.y picks the tensor, the x
 * blocks stride over its elements. Pointers and sizes are kernel arguments.
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim.h"

#include <math.h>

#define OPT_LIST_MAX 24
#define OPT_THREADS 256
#define OPT_MAX_BLOCKS 4096

__device__ __forceinline__ float r_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float r_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float r_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float r_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float r_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double r_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double r_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double r_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double r_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ double r_sqrt(double a) { return __dsqrt_rn(a); }

/* The step's scalars: kernels/cpu/optim.c's adamw_consts_of, rounded to T. */
template <typename T> struct adamw_k {
    T b1, b2, omb1, omb2, step_size, inv_bc2_sqrt, eps, decay, l2, sign;
};

template <typename T> static adamw_k<T> adamw_consts(const ct_adamw_hparams *h)
{
    const double t = (double)h->step;
    const double bc1 = 1 - pow(h->beta1, t), bc2 = 1 - pow(h->beta2, t);
    const bool wd = h->weight_decay != 0;
    adamw_k<T> k;
    k.b1 = (T)h->beta1;
    k.b2 = (T)h->beta2;
    k.omb1 = (T)(1 - h->beta1);
    k.omb2 = (T)(1 - h->beta2);
    k.step_size = (T)(h->lr / bc1);
    k.inv_bc2_sqrt = (T)(1 / sqrt(bc2));
    k.eps = (T)h->eps;
    k.decay = (T)(wd && h->decoupled ? 1 - h->lr * h->weight_decay : 1);
    k.l2 = (T)(wd && !h->decoupled ? h->weight_decay : 0); /* 0 * p adds an exact zero */
    k.sign = (T)(h->maximize ? -1 : 1);
    return k;
}

template <typename T> struct adamw_list {
    T *p[OPT_LIST_MAX];
    const T *g[OPT_LIST_MAX];
    T *m[OPT_LIST_MAX];
    T *v[OPT_LIST_MAX];
    int64_t n[OPT_LIST_MAX];
};

// p, g, m, v (n each, tensor blockIdx.y of the list) -> p, m, v overwritten:
//   g = sign*g + l2*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*(g*g)
//   p = p*decay - step_size*m / (sqrt(v)*inv_bc2_sqrt + eps)
template <typename T> __global__ void adamw_kernel(adamw_list<T> L, adamw_k<T> k)
{
    const int t = blockIdx.y;
    T *p = L.p[t], *m = L.m[t], *v = L.v[t];
    const T *g = L.g[t];
    const int64_t n = L.n[t];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T gi = g[i], pi = p[i], mi = m[i], vi = v[i];
        gi = r_add(r_mul(k.sign, gi), r_mul(k.l2, pi));
        mi = r_add(r_mul(k.b1, mi), r_mul(k.omb1, gi));
        vi = r_add(r_mul(k.b2, vi), r_mul(k.omb2, r_mul(gi, gi)));
        pi = r_sub(r_mul(pi, k.decay),
                   r_div(r_mul(k.step_size, mi), r_add(r_mul(r_sqrt(vi), k.inv_bc2_sqrt), k.eps)));
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}

/* Launches over entries idx[0..cnt) of the lists, all of dtype T. */
template <typename T>
static ct_status adamw_launch(ct_tensor *const *params, const ct_tensor *const *grads, ct_tensor *const *m,
                              ct_tensor *const *v, const int *idx, int cnt, const ct_adamw_hparams *h)
{
    adamw_list<T> L;
    int64_t most = 0;
    for (int j = 0; j < cnt; j++) {
        const int i = idx[j];
        L.p[j] = cti_cu_ptr<T>(params[i]);
        L.g[j] = cti_cu_ptr<T>(grads[i]);
        L.m[j] = cti_cu_ptr<T>(m[i]);
        L.v[j] = cti_cu_ptr<T>(v[i]);
        L.n[j] = ct_tensor_numel(params[i]);
        if (L.n[j] > most) most = L.n[j];
    }
    for (int j = cnt; j < OPT_LIST_MAX; j++) L.p[j] = L.m[j] = L.v[j] = NULL, L.g[j] = NULL, L.n[j] = 0;
    if (most == 0) return CT_OK;
    unsigned bx = cti_cu_blocks(most, OPT_THREADS);
    if (bx > OPT_MAX_BLOCKS) bx = OPT_MAX_BLOCKS;
    const ct_tensor *first = params[idx[0]];
    adamw_kernel<T><<<dim3(bx, (unsigned)cnt), OPT_THREADS, 0, cti_cu_stream(first)>>>(L, adamw_consts<T>(h));
    return cti_cuda_launched("adamw", first);
}

extern "C" ct_status cti_cuda_adamw_list(int n, ct_tensor *const *params, const ct_tensor *const *grads,
                                         ct_tensor *const *m, ct_tensor *const *v, const ct_adamw_hparams *h)
{
    if (n <= 0) return CT_OK;
    ct_status st = cti_cuda_enter(params[0]->device.index, "adamw");
    if (st) return st;
    /* one pass per dtype, groups of OPT_LIST_MAX in list order */
    static const ct_dtype dts[2] = {CT_DTYPE_F32, CT_DTYPE_F64};
    for (int d = 0; d < 2; d++) {
        int idx[OPT_LIST_MAX], cnt = 0;
        for (int i = 0; i <= n; i++) {
            if (i < n && params[i]->dtype == dts[d]) idx[cnt++] = i;
            if (cnt == OPT_LIST_MAX || (i == n && cnt > 0)) {
                st = dts[d] == CT_DTYPE_F32 ? adamw_launch<float>(params, grads, m, v, idx, cnt, h)
                                            : adamw_launch<double>(params, grads, m, v, idx, cnt, h);
                if (st) return st;
                cnt = 0;
            }
        }
    }
    return CT_OK;
}

extern "C" ct_status cti_cuda_adamw(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
                                    const ct_adamw_hparams *h)
{
    return cti_cuda_adamw_list(1, &param, &grad, &m, &v, h);
}

// The documented formulas literally, in double (kernels/cpu/optim.c's cti_cpu_adamw_f32_ref).
template <typename T>
__global__ void adamw_ref_kernel(T *p, const T *g, T *m, T *v, int64_t n, ct_adamw_hparams h, double bc1, double bc2)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double gi = h.maximize ? -(double)g[i] : (double)g[i], pi = p[i];
        if (h.weight_decay != 0) {
            if (h.decoupled) pi *= 1 - h.lr * h.weight_decay;
            else gi += h.weight_decay * pi;
        }
        const double mi = h.beta1 * m[i] + (1 - h.beta1) * gi;
        const double vi = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
        const double mhat = mi / bc1, vhat = vi / bc2;
        p[i] = (T)(pi - h.lr * mhat / (sqrt(vhat) + h.eps));
        m[i] = (T)mi;
        v[i] = (T)vi;
    }
}

extern "C" ct_status cti_cuda_adamw_ref(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
                                        const ct_adamw_hparams *h)
{
    ct_status st = cti_cuda_enter(param->device.index, "adamw_ref");
    if (st) return st;
    const int64_t n = ct_tensor_numel(param);
    if (n == 0) return CT_OK;
    const double t = (double)h->step, bc1 = 1 - pow(h->beta1, t), bc2 = 1 - pow(h->beta2, t);
    cudaStream_t s = cti_cu_stream(param);
    const unsigned blocks = cti_cu_blocks(n, OPT_THREADS);
    if (param->dtype == CT_DTYPE_F64)
        adamw_ref_kernel<double><<<blocks, OPT_THREADS, 0, s>>>(cti_cu_ptr<double>(param), cti_cu_ptr<double>(grad),
                                                                cti_cu_ptr<double>(m), cti_cu_ptr<double>(v), n, *h,
                                                                bc1, bc2);
    else
        adamw_ref_kernel<float><<<blocks, OPT_THREADS, 0, s>>>(cti_cu_ptr<float>(param), cti_cu_ptr<float>(grad),
                                                               cti_cu_ptr<float>(m), cti_cu_ptr<float>(v), n, *h, bc1,
                                                               bc2);
    return cti_cuda_launched("adamw_ref", param);
}

/* ---- SGD -------------------------------------------------------------------------------- */

template <typename T> struct sgd_k {
    T wd, mom, omd, lr;
    bool decay, first, nesterov, use_buf;
};

// p, g, buf (n) -> p, buf overwritten:
//   g = g + wd*p (wd != 0);  buf = first ? g : mom*buf + (1-dampening)*g;
//   p = p - lr * (nesterov ? g + mom*buf : buf)     (without momentum: p = p - lr*g)
template <typename T> __global__ void sgd_kernel(T *p, const T *g, T *buf, int64_t n, sgd_k<T> k)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T gi = g[i];
        if (k.decay) gi = r_add(gi, r_mul(k.wd, p[i]));
        if (k.use_buf) {
            const T b = k.first ? gi : r_add(r_mul(k.mom, buf[i]), r_mul(k.omd, gi));
            buf[i] = b;
            p[i] = r_sub(p[i], r_mul(k.lr, k.nesterov ? r_add(gi, r_mul(k.mom, b)) : b));
        } else {
            p[i] = r_sub(p[i], r_mul(k.lr, gi));
        }
    }
}

template <typename T>
static void sgd_launch(ct_tensor *param, const ct_tensor *grad, ct_tensor *buf, int64_t n, const ct_sgd_hparams *h)
{
    sgd_k<T> k;
    k.wd = (T)h->weight_decay;
    k.mom = (T)h->momentum;
    k.omd = (T)(1 - h->dampening);
    k.lr = (T)h->lr;
    k.decay = h->weight_decay != 0;
    k.first = h->first_step;
    k.nesterov = h->nesterov;
    k.use_buf = buf && h->momentum != 0;
    unsigned bx = cti_cu_blocks(n, OPT_THREADS);
    if (bx > OPT_MAX_BLOCKS) bx = OPT_MAX_BLOCKS;
    sgd_kernel<T><<<bx, OPT_THREADS, 0, cti_cu_stream(param)>>>(cti_cu_ptr<T>(param), cti_cu_ptr<T>(grad),
                                                               k.use_buf ? cti_cu_ptr<T>(buf) : NULL, n, k);
}

extern "C" ct_status cti_cuda_sgd(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf,
                                  const ct_sgd_hparams *h)
{
    ct_status st = cti_cuda_enter(param->device.index, "sgd");
    if (st) return st;
    const int64_t n = ct_tensor_numel(param);
    if (n == 0) return CT_OK;
    if (param->dtype == CT_DTYPE_F64) sgd_launch<double>(param, grad, momentum_buf, n, h);
    else sgd_launch<float>(param, grad, momentum_buf, n, h);
    return cti_cuda_launched("sgd", param);
}

// kernels/cpu/optim.c's cti_cpu_sgd_f32_ref: every operation in double, stored once.
template <typename T> __global__ void sgd_ref_kernel(T *p, const T *g, T *buf, int64_t n, ct_sgd_hparams h)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double gi = g[i];
        if (h.weight_decay != 0) gi += h.weight_decay * (double)p[i];
        if (h.momentum != 0 && buf) {
            const double b = h.first_step ? gi : h.momentum * (double)buf[i] + (1 - h.dampening) * gi;
            buf[i] = (T)b;
            gi = h.nesterov ? gi + h.momentum * b : b;
        }
        p[i] = (T)((double)p[i] - h.lr * gi);
    }
}

extern "C" ct_status cti_cuda_sgd_ref(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf,
                                      const ct_sgd_hparams *h)
{
    ct_status st = cti_cuda_enter(param->device.index, "sgd_ref");
    if (st) return st;
    const int64_t n = ct_tensor_numel(param);
    if (n == 0) return CT_OK;
    cudaStream_t s = cti_cu_stream(param);
    const unsigned blocks = cti_cu_blocks(n, OPT_THREADS);
    const bool use_buf = momentum_buf && h->momentum != 0;
    if (param->dtype == CT_DTYPE_F64)
        sgd_ref_kernel<double><<<blocks, OPT_THREADS, 0, s>>>(cti_cu_ptr<double>(param), cti_cu_ptr<double>(grad),
                                                              use_buf ? cti_cu_ptr<double>(momentum_buf) : NULL, n,
                                                              *h);
    else
        sgd_ref_kernel<float><<<blocks, OPT_THREADS, 0, s>>>(cti_cu_ptr<float>(param), cti_cu_ptr<float>(grad),
                                                             use_buf ? cti_cu_ptr<float>(momentum_buf) : NULL, n, *h);
    return cti_cuda_launched("sgd_ref", param);
}
