/* The Accelerator's fp8 recipe and amax exchange (accel/fp8_sync_internal.h). */
#include "accel/fp8_sync_internal.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/frame.h"
#include "dist/env.h"

static ct_status env_choice(const char *var, const char *const *names, int n, int *out)
{
    const char *v = getenv(var);
    if (!v || !*v) return CT_OK;
    for (int i = 0; i < n; i++)
        if (!strcasecmp(v, names[i])) {
            *out = i;
            return CT_OK;
        }
    return ct_error_set(CT_ERR_INVALID, "%s='%s' is not %s or %s", var, v, names[0], names[1]);
}

ct_status cti_accel_fp8_recipe(const ct_fp8_recipe *cfg, ct_fp8_recipe *out)
{
    ct_fp8_recipe r = cfg ? *cfg : (ct_fp8_recipe){0};
    static const char *const formats[] = {"hybrid", "e4m3"}, *const algos[] = {"max", "most_recent"};
    int v = -1, flag = 0;
    ct_status st = CT_OK;
    if (!st && r.format == CT_FP8_HYBRID && !(st = env_choice("CTRAIN_FP8_FORMAT", formats, 2, &v)) && v >= 0)
        r.format = (ct_fp8_format)v;
    v = -1;
    if (!st && r.amax_compute_algo == CT_FP8_AMAX_MAX &&
        !(st = env_choice("CTRAIN_FP8_AMAX_COMPUTE_ALGO", algos, 2, &v)) && v >= 0)
        r.amax_compute_algo = (ct_fp8_amax_algo)v;
    if (!st && r.amax_history_len == 0) st = ct_dist_env_int("CTRAIN_FP8_AMAX_HISTORY_LEN", 0, 1, &r.amax_history_len);
    if (!st && r.margin == 0) st = ct_dist_env_int("CTRAIN_FP8_MARGIN", 0, 0, &r.margin);
    if (!st && !r.fp8_embedding_and_head && !(st = ct_dist_env_int("CTRAIN_FP8_EMBEDDING_AND_HEAD", 0, 0, &flag))) {
        if (flag > 1) st = ct_error_set(CT_ERR_INVALID, "CTRAIN_FP8_EMBEDDING_AND_HEAD='%d' is not 0 or 1", flag);
        r.fp8_embedding_and_head = flag == 1;
    }
    if (!st) st = ct_fp8_recipe_resolve(&r, out);
    return st;
}

ct_status cti_accel_fp8_sync(ct_fp8_state *st, ct_pg *pg)
{
    int n = ct_fp8_state_amax_count(st), world = ct_pg_size(pg);
    if (world == 1) {
        ct_fp8_state_step(st);
        return CT_OK;
    }
    ct_status s = CT_OK;
    CT_FRAME {
        /* [n, -n] with MAX gives the largest and the smallest count */
        ct_tensor *cnt = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2), (int64_t[]){n, -n});
        ct_work *w = cnt ? ct_pg_allreduce(pg, cnt, CT_REDUCE_MAX) : NULL;
        s = w ? ct_work_wait(w) : ct_last_status();
        ct_work_free(w);
        const int64_t *c = s ? NULL : ct_tensor_data(cnt);
        if (c && (c[0] != n || -c[1] != n))
            s = ct_error_set(CT_ERR_INVALID,
                             "fp8: rank %d has %d fp8 weights, but ranks hold between %lld and %lld; every rank "
                             "must run the same model", ct_pg_rank(pg), n / 3, (long long)-c[1] / 3, (long long)c[0] / 3);
        ct_tensor *buf = !s && n ? ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(n)) : NULL;
        if (buf) {
            ct_fp8_state_amax_get(st, ct_tensor_data(buf));
            /* NaN survives MAX, so one rank's overflow keeps every rank's scale */
            w = ct_pg_allreduce(pg, buf, CT_REDUCE_MAX);
            s = w ? ct_work_wait(w) : ct_last_status();
            ct_work_free(w);
            if (!s) ct_fp8_state_amax_set(st, ct_tensor_data(buf));
        } else if (!s && n) {
            s = ct_last_status();
        }
    }
    if (s) return ct_error_prefix("fp8 amax all-reduce (rank %d): ", ct_pg_rank(pg));
    ct_fp8_state_step(st);
    return CT_OK;
}
