/* ctrain — CPU optimizer updates: fused AdamW/Adam and SGD over flat buffers.
 *
 * Each update streams p, g and the state once (AdamW: 4 reads + 3 writes per element),
 * so it is bound by memory bandwidth; the loops are written branch-free per element
 * (loop-invariant options are hoisted) so they vectorise. */
#include "kernels/cpu/optim.h"

#include <math.h>
#include <string.h>

#include "core/threads_internal.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#define PAR_MIN_WORK 32768

/* The step's scalars, worked out once in double. */
typedef struct adamw_consts {
    double b1, b2, omb1, omb2, step_size, inv_bc2_sqrt, eps, decay, l2, sign;
} adamw_consts;

static adamw_consts adamw_consts_of(const ct_adamw_hparams *h)
{
    const double t = (double)h->step;
    const double bc1 = 1 - pow(h->beta1, t), bc2 = 1 - pow(h->beta2, t);
    const bool wd = h->weight_decay != 0;
    return (adamw_consts){
        .b1 = h->beta1,
        .b2 = h->beta2,
        .omb1 = 1 - h->beta1,
        .omb2 = 1 - h->beta2,
        .step_size = h->lr / bc1,
        .inv_bc2_sqrt = 1 / sqrt(bc2),
        .eps = h->eps,
        .decay = wd && h->decoupled ? 1 - h->lr * h->weight_decay : 1,
        .l2 = wd && !h->decoupled ? h->weight_decay : 0, /* 0 * p adds an exact zero */
        .sign = h->maximize ? -1 : 1,
    };
}

/* Registers of floats/doubles (GCC/Clang vector extension) with a hardware square root:
 * the plain loop does not vectorise because sqrtf may set errno. */
#ifdef __AVX__
#define OPT_VBYTES 32
#else
#define OPT_VBYTES 16
#endif
typedef float vf32 __attribute__((vector_size(OPT_VBYTES)));
typedef double vf64 __attribute__((vector_size(OPT_VBYTES)));

static inline vf32 vsqrt_f32(vf32 x)
{
#if defined(__AVX__)
    return (vf32)_mm256_sqrt_ps((__m256)x);
#elif defined(__SSE2__)
    return (vf32)_mm_sqrt_ps((__m128)x);
#else
    for (int i = 0; i < (int)(sizeof x / sizeof x[0]); i++) x[i] = sqrtf(x[i]);
    return x;
#endif
}

static inline vf64 vsqrt_f64(vf64 x)
{
#if defined(__AVX__)
    return (vf64)_mm256_sqrt_pd((__m256d)x);
#elif defined(__SSE2__)
    return (vf64)_mm_sqrt_pd((__m128d)x);
#else
    for (int i = 0; i < (int)(sizeof x / sizeof x[0]); i++) x[i] = sqrt(x[i]);
    return x;
#endif
}

// One element or one register of them (the same expressions serve both, so a value
// never depends on its position): g, p, m, v in, p, m, v out.
#define ADAMW_ELEM(gi, pi, mi, vi, SQRT)                                   \
    do {                                                                   \
        gi = sign * gi + l2 * pi;                                          \
        mi = b1 * mi + omb1 * gi;                                          \
        vi = b2 * vi + omb2 * (gi * gi);                                   \
        pi = pi * decay - step_size * mi / (SQRT(vi) * inv_bc2_sqrt + eps); \
    } while (0)

// p, g, m, v (n) -> p, m, v updated in place (overwritten); see kernels/optim.h for the math.
// l2 is 0 for AdamW (and wd = 0) and decay 1 for Adam, so one expression covers both.
#define ADAMW_LOOP(T, VT, SQRT, VSQRT)                                                           \
    do {                                                                                         \
        enum { L = (int)(sizeof(VT) / sizeof(T)) };                                              \
        const adamw_consts k = adamw_consts_of(h);                                              \
        const T b1 = (T)k.b1, b2 = (T)k.b2, omb1 = (T)k.omb1, omb2 = (T)k.omb2;                 \
        const T step_size = (T)k.step_size, inv_bc2_sqrt = (T)k.inv_bc2_sqrt, eps = (T)k.eps;   \
        const T decay = (T)k.decay, l2 = (T)k.l2, sign = (T)k.sign;                             \
        const int64_t nvec = n / L;                                                             \
        _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN_WORK)") \
        for (int64_t c = 0; c < nvec; c++) {                                                    \
            const int64_t i = c * L;                                                            \
            VT gi, pi, mi, vi;                                                                  \
            memcpy(&gi, g + i, sizeof gi), memcpy(&pi, p + i, sizeof pi);                       \
            memcpy(&mi, m + i, sizeof mi), memcpy(&vi, v + i, sizeof vi);                       \
            ADAMW_ELEM(gi, pi, mi, vi, VSQRT);                                                  \
            memcpy(p + i, &pi, sizeof pi), memcpy(m + i, &mi, sizeof mi);                       \
            memcpy(v + i, &vi, sizeof vi);                                                      \
        }                                                                                       \
        for (int64_t i = nvec * L; i < n; i++) {                                                \
            T gi = g[i], pi = p[i], mi = m[i], vi = v[i];                                       \
            ADAMW_ELEM(gi, pi, mi, vi, SQRT);                                                   \
            p[i] = pi, m[i] = mi, v[i] = vi;                                                    \
        }                                                                                       \
    } while (0)

void cti_cpu_adamw_f32(float *p, const float *g, float *m, float *v, int64_t n, const ct_adamw_hparams *h)
{
    ADAMW_LOOP(float, vf32, sqrtf, vsqrt_f32);
}

void cti_cpu_adamw_f64(double *p, const double *g, double *m, double *v, int64_t n, const ct_adamw_hparams *h)
{
    ADAMW_LOOP(double, vf64, sqrt, vsqrt_f64);
}

/* The documented formulas literally, in double. */
void cti_cpu_adamw_f32_ref(float *p, const float *g, float *m, float *v, int64_t n, const ct_adamw_hparams *h)
{
    const double t = (double)h->step;
    for (int64_t i = 0; i < n; i++) {
        double gi = h->maximize ? -(double)g[i] : (double)g[i], pi = p[i];
        if (h->weight_decay != 0) {
            if (h->decoupled) pi *= 1 - h->lr * h->weight_decay;
            else gi += h->weight_decay * pi;
        }
        const double mi = h->beta1 * m[i] + (1 - h->beta1) * gi;
        const double vi = h->beta2 * v[i] + (1 - h->beta2) * gi * gi;
        const double mhat = mi / (1 - pow(h->beta1, t)), vhat = vi / (1 - pow(h->beta2, t));
        p[i] = (float)(pi - h->lr * mhat / (sqrt(vhat) + h->eps));
        m[i] = (float)mi;
        v[i] = (float)vi;
    }
}

// p, g, buf (n) -> p, buf updated in place (overwritten); see kernels/optim.h for the math.
#define SGD_LOOP(T)                                                                                \
    do {                                                                                           \
        const T wd = (T)h->weight_decay, mom = (T)h->momentum, omd = (T)(1 - h->dampening);       \
        const T lr = (T)h->lr;                                                                     \
        const bool decay = h->weight_decay != 0, first = h->first_step, nesterov = h->nesterov;   \
        if (!buf || h->momentum == 0) {                                                            \
            _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN_WORK)") \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T gi = g[i];                                                                       \
                if (decay) gi += wd * p[i];                                                        \
                p[i] -= lr * gi;                                                                   \
            }                                                                                      \
        } else {                                                                                   \
            _Pragma("omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > PAR_MIN_WORK)") \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T gi = g[i];                                                                       \
                if (decay) gi += wd * p[i];                                                        \
                const T b = first ? gi : mom * buf[i] + omd * gi;                                  \
                buf[i] = b;                                                                        \
                p[i] -= lr * (nesterov ? gi + mom * b : b);                                        \
            }                                                                                      \
        }                                                                                          \
    } while (0)

void cti_cpu_sgd_f32(float *p, const float *g, float *buf, int64_t n, const ct_sgd_hparams *h) { SGD_LOOP(float); }

void cti_cpu_sgd_f64(double *p, const double *g, double *buf, int64_t n, const ct_sgd_hparams *h) { SGD_LOOP(double); }

void cti_cpu_sgd_f32_ref(float *p, const float *g, float *buf, int64_t n, const ct_sgd_hparams *h)
{
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i];
        if (h->weight_decay != 0) gi += h->weight_decay * (double)p[i];
        if (h->momentum != 0 && buf) {
            const double b = h->first_step ? gi : h->momentum * buf[i] + (1 - h->dampening) * gi;
            buf[i] = (float)b;
            gi = h->nesterov ? gi + h->momentum * b : b;
        }
        p[i] = (float)(p[i] - h->lr * gi);
    }
}

ct_status cti_cpu_adamw(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v, const ct_adamw_hparams *h)
{
    cti_threads_sync();
    const int64_t n = ct_tensor_numel(param);
    if (param->dtype == CT_DTYPE_F64)
        cti_cpu_adamw_f64(ct_tensor_data(param), ct_tensor_data(grad), ct_tensor_data(m), ct_tensor_data(v), n, h);
    else
        cti_cpu_adamw_f32(ct_tensor_data(param), ct_tensor_data(grad), ct_tensor_data(m), ct_tensor_data(v), n, h);
    return CT_OK;
}

ct_status cti_cpu_sgd(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf, const ct_sgd_hparams *h)
{
    cti_threads_sync();
    const int64_t n = ct_tensor_numel(param);
    void *buf = momentum_buf && h->momentum != 0 ? ct_tensor_data(momentum_buf) : NULL;
    if (param->dtype == CT_DTYPE_F64)
        cti_cpu_sgd_f64(ct_tensor_data(param), ct_tensor_data(grad), buf, n, h);
    else
        cti_cpu_sgd_f32(ct_tensor_data(param), ct_tensor_data(grad), buf, n, h);
    return CT_OK;
}
