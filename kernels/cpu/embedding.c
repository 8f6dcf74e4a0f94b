/* CPU embedding: gather forward, deterministic scatter-add backward.
 *
 * Backward plan: a stable counting sort of the positions by id gives, for each
 * id present, its positions in increasing order; each such id is one task that
 * owns its dweight row, so no two threads write one row and each row sums its
 * dout rows in position order: the same bits for any thread count, and for
 * f32 the same bits as the naive sequential loop. O(n + V) extra memory.
 */
#include "kernels/cpu/embedding.h"

#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/threads.h"
#include "kernels/cpu/indices.h"

#define PAR_MIN 32768 /* elements of work below which a loop stays on one thread */

/* Every id in [0, V). */
static ct_status check_ids(const char *op, const ct_tensor *ids, const char *name, const ct_tensor *table)
{
    int64_t V = table->shape[0], i = cti_cpu_index_find_bad(ids, V, false, 0, NULL);
    if (i < 0) return CT_OK;
    char pos[160], a[200], b[200];
    int64_t id = cti_cpu_index_at(ct_tensor_data(ids), ids->dtype == CT_DTYPE_I64, i);
    return ct_error_set(CT_ERR_INVALID,
                        "%s: id %lld at position %s of ids %s is out of range for the V = %lld rows of %s %s "
                        "(expected 0 <= id < %lld)",
                        op, (long long)id, cti_cpu_index_pos(ids, i, pos, sizeof pos),
                        ct_tensor_describe(ids, a, sizeof a), (long long)V, name,
                        ct_tensor_describe(table, b, sizeof b), (long long)V);
}

// weight (V, C), ids (n) -> out (n, C); out[i] = weight[ids[i]], a row copy of any dtype
ct_status cti_cpu_embedding(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out)
{
    ct_status st = check_ids("embedding", ids, "weight", weight);
    if (st) return st;
    int64_t n = ct_tensor_numel(ids), C = weight->shape[1];
    size_t row = (size_t)C * ct_dtype_size(weight->dtype);
    const char *w = ct_tensor_data(weight);
    char *o = ct_tensor_data(out);
    const void *p = ct_tensor_data(ids);
    bool i64 = ids->dtype == CT_DTYPE_I64;
    if (row == 0) return CT_OK;
    #pragma omp parallel for num_threads(ct_get_num_threads()) schedule(static) if (n * C > PAR_MIN)
    for (int64_t i = 0; i < n; i++) memcpy(o + (size_t)i * row, w + (size_t)cti_cpu_index_at(p, i64, i) * row, row);
    return CT_OK;
}

/* dweight (V, C) += dout rows by id, accumulating in T (compute dtype CD). Rows of
 * dweight or dout in another dtype go through scratch (two C-buffers per thread).
 * pos[start[id] .. start[id + 1]) are the positions holding id, increasing. */
#define DEFINE_EMBEDDING_BACKWARD(T, SUF, CD)                                                                \
    static void scatter_add_##SUF(void *dw, ct_dtype wdt, const void *dout, ct_dtype ddt,                    \
                                  const int64_t *uniq, int64_t K, const int64_t *start, const int64_t *pos,   \
                                  int64_t C, T *scratch, int nt, bool par)                                    \
    {                                                                                                        \
        int64_t wes = (int64_t)ct_dtype_size(wdt), des = (int64_t)ct_dtype_size(ddt);                        \
        /* dynamic: ids can be very unequal in count; each row is still summed by one task in a fixed order */ \
        _Pragma("omp parallel for num_threads(nt) schedule(dynamic, 16) if (par)")                           \
        for (int64_t k = 0; k < K; k++) {                                                                    \
            int64_t id = uniq[k];                                                                            \
            T *buf = scratch ? scratch + (int64_t)omp_get_thread_num() * 2 * C : NULL;                       \
            char *wrow = (char *)dw + id * C * wes;                                                          \
            T *restrict acc = wdt == CD ? (T *)wrow : buf;                                                   \
            if (wdt != CD) ct_convert_n(CD, acc, wdt, wrow, C, false);                                       \
            for (int64_t j = start[id]; j < start[id + 1]; j++) {                                            \
                const char *drow = (const char *)dout + pos[j] * C * des;                                    \
                const T *restrict d = (const T *)drow;                                                       \
                if (ddt != CD) {                                                                             \
                    ct_convert_n(CD, buf + C, ddt, drow, C, false);                                          \
                    d = buf + C;                                                                             \
                }                                                                                            \
                for (int64_t c = 0; c < C; c++) acc[c] += d[c];                                              \
            }                                                                                                \
            if (wdt != CD) ct_convert_n(wdt, wrow, CD, acc, C, false);                                       \
        }                                                                                                    \
    }

DEFINE_EMBEDDING_BACKWARD(float, f32, CT_DTYPE_F32)
DEFINE_EMBEDDING_BACKWARD(double, f64, CT_DTYPE_F64)

ct_status cti_cpu_embedding_backward(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids)
{
    ct_status st = check_ids("embedding_backward", ids, "dweight", dweight);
    if (st) return st;
    int64_t n = ct_tensor_numel(ids), V = dweight->shape[0], C = dweight->shape[1];
    if (n == 0 || C == 0) return CT_OK;
    ct_dtype cd = dweight->dtype == CT_DTYPE_F64 ? CT_DTYPE_F64 : CT_DTYPE_F32;
    bool convert = dweight->dtype != cd || dout->dtype != cd;
    int nt = ct_get_num_threads();
    ct_frame_push();
    /* start (V + 1), pos (n), uniq (<= n) */
    ct_tensor *idx = ct_tensor_zeros(CT_DTYPE_I64, 1, (int64_t[]){V + 1 + 2 * n});
    ct_tensor *scr = convert ? ct_tensor_empty(cd, 1, (int64_t[]){(int64_t)nt * 2 * C}) : NULL;
    if (!idx || (convert && !scr)) {
        ct_frame_pop();
        return ct_last_status();
    }
    int64_t *start = ct_tensor_data(idx), *pos = start + V + 1, *uniq = pos + n, K = 0;
    const void *p = ct_tensor_data(ids);
    bool i64 = ids->dtype == CT_DTYPE_I64;
    for (int64_t i = 0; i < n; i++) start[cti_cpu_index_at(p, i64, i) + 1]++;
    for (int64_t v = 0; v < V; v++) {
        if (start[v + 1]) uniq[K++] = v;
        start[v + 1] += start[v];
    }
    /* stable placement, using start[v] as id v's cursor; afterwards start[v] has moved to
     * start[v + 1], so shifting by one restores the bucket starts */
    for (int64_t i = 0; i < n; i++) pos[start[cti_cpu_index_at(p, i64, i)]++] = i;
    for (int64_t v = V; v > 0; v--) start[v] = start[v - 1];
    start[0] = 0;
    void *sp = scr ? ct_tensor_data(scr) : NULL;
    bool par = n * C > PAR_MIN;
    if (cd == CT_DTYPE_F64)
        scatter_add_f64(ct_tensor_data(dweight), dweight->dtype, ct_tensor_data(dout), dout->dtype, uniq, K, start,
                        pos, C, sp, nt, par);
    else
        scatter_add_f32(ct_tensor_data(dweight), dweight->dtype, ct_tensor_data(dout), dout->dtype, uniq, K, start,
                        pos, C, sp, nt, par);
    ct_frame_pop();
    return CT_OK;
}

/* ---- reference ---------------------------------------------------------------- */

ct_status cti_cpu_embedding_ref(const ct_tensor *weight, const ct_tensor *ids, ct_tensor *out)
{
    ct_status st = check_ids("embedding", ids, "weight", weight);
    if (st) return st;
    int64_t n = ct_tensor_numel(ids), C = weight->shape[1];
    size_t es = ct_dtype_size(weight->dtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t id = cti_cpu_index_at(ct_tensor_data(ids), ids->dtype == CT_DTYPE_I64, i);
        for (int64_t c = 0; c < C; c++)
            memcpy((char *)ct_tensor_data(out) + (size_t)(i * C + c) * es,
                   (const char *)ct_tensor_data(weight) + (size_t)(id * C + c) * es, es);
    }
    return CT_OK;
}

/* The naive loop in position order, summing in a double copy of dweight that is
 * rounded back once. */
ct_status cti_cpu_embedding_backward_ref(ct_tensor *dweight, const ct_tensor *dout, const ct_tensor *ids)
{
    ct_status st = check_ids("embedding_backward", ids, "dweight", dweight);
    if (st) return st;
    int64_t n = ct_tensor_numel(ids), V = dweight->shape[0], C = dweight->shape[1];
    ct_frame_push();
    ct_tensor *acc = ct_tensor_empty(CT_DTYPE_F64, 2, (int64_t[]){V, C});
    if (!acc) {
        ct_frame_pop();
        return ct_last_status();
    }
    double *a = ct_tensor_data(acc);
    size_t wes = ct_dtype_size(dweight->dtype), des = ct_dtype_size(dout->dtype);
    for (int64_t i = 0; i < V * C; i++) a[i] = ct_scalar_load(dweight->dtype, (char *)ct_tensor_data(dweight) + i * wes);
    for (int64_t i = 0; i < n; i++) {
        int64_t id = cti_cpu_index_at(ct_tensor_data(ids), ids->dtype == CT_DTYPE_I64, i);
        for (int64_t c = 0; c < C; c++)
            a[id * C + c] += ct_scalar_load(dout->dtype, (const char *)ct_tensor_data(dout) + (i * C + c) * des);
    }
    for (int64_t i = 0; i < V * C; i++) ct_scalar_store(dweight->dtype, (char *)ct_tensor_data(dweight) + i * wes, a[i]);
    ct_frame_pop();
    return CT_OK;
}
