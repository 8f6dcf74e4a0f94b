/* ctrain — integer index tensors for the CPU kernels (embedding ids,
 * cross-entropy targets): reading an entry, checking the range, and naming an
 * entry's position in an error message. The tensors are contiguous i64 or i32. */
#ifndef CT_KERNELS_CPU_INDICES_H
#define CT_KERNELS_CPU_INDICES_H

#include <stdbool.h>
#include <stdint.h>

#include "core/tensor.h"

/* Entry i of an index buffer: int64_t entries when i64, else int32_t. */
static inline int64_t cti_cpu_index_at(const void *p, bool i64, int64_t i)
{
    return i64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* Flat position i of t as a multi-index "[1, 2]" into buf; returns buf. */
static inline const char *cti_cpu_index_pos(const ct_tensor *t, int64_t i, char *buf, int cap)
{
    int64_t idx[CT_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    return ct_shape_str(t->ndim, idx, buf, cap);
}

/* The flat position of the first entry of idx outside [0, V), or -1 when there
 * is none. With skip, entries equal to `ignore` are allowed and not counted;
 * *count (when not NULL) gets the number of counted entries (up to the bad one). */
static inline int64_t cti_cpu_index_find_bad(const ct_tensor *idx, int64_t V, bool skip, int64_t ignore,
                                             int64_t *count)
{
    const void *p = ct_tensor_data(idx);
    bool i64 = idx->dtype == CT_DTYPE_I64;
    int64_t n = ct_tensor_numel(idx), c = 0, bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        int64_t v = cti_cpu_index_at(p, i64, i);
        if (skip && v == ignore) continue;
        if (v < 0 || v >= V) bad = i;
        else c++;
    }
    if (count) *count = c;
    return bad;
}

#endif
