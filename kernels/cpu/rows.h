/* ctrain — helpers for the CPU kernels that work on rows of contiguous tensors
 * (softmax, norms, cross-entropy): the row geometry, parallel dtype conversion of
 * whole buffers, and element access through double for the _ref kernels. */
#ifndef CT_KERNELS_CPU_ROWS_H
#define CT_KERNELS_CPU_ROWS_H

#include <stdint.h>

#include "core/convert.h"
#include "core/tensor.h"
#include "core/threads.h"

/* Length of t's rows: its last dim (1 for a 0-d tensor). */
static inline int64_t cti_cpu_row_len(const ct_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

/* Number of rows: the product of every dim but the last. */
static inline int64_t cti_cpu_row_count(const ct_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim - 1; d++) n *= t->shape[d];
    return n;
}

/* ct_convert_n over n contiguous elements, in chunks across threads (it is
 * single-threaded on its own); below 32768 elements on one thread. */
static inline void cti_cpu_convert_par(ct_dtype dd, void *dst, ct_dtype sd, const void *src, int64_t n)
{
    const int64_t chunk = 1 << 14;
    int64_t nchunks = (n + chunk - 1) / chunk;
    size_t ds = ct_dtype_size(dd), ss = ct_dtype_size(sd);
    #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n > 32768)
    for (int64_t k = 0; k < nchunks; k++) {
        int64_t i0 = k * chunk, m = n - i0 < chunk ? n - i0 : chunk;
        ct_convert_n(dd, (char *)dst + i0 * (int64_t)ds, sd, (const char *)src + i0 * (int64_t)ss, m, false);
    }
}

/* Element i of a contiguous tensor of any dtype, as a double (the references' loads). */
static inline double cti_cpu_load_at(const ct_tensor *t, int64_t i)
{
    return ct_scalar_load(t->dtype, (const char *)ct_tensor_data(t) + i * (int64_t)ct_dtype_size(t->dtype));
}

/* Element i of a contiguous tensor set to v, rounded to its dtype. */
static inline void cti_cpu_store_at(ct_tensor *t, int64_t i, double v)
{
    ct_scalar_store(t->dtype, (char *)ct_tensor_data(t) + i * (int64_t)ct_dtype_size(t->dtype), v);
}

#endif
