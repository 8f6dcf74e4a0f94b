/* Requests: completion, waiting, reference counting, and the names used in messages.
 * The fields and the two-reference rule are described in dist/comm_internal.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"

ct_work *cti_work_new(void)
{
    ct_work *w = calloc(1, sizeof *w);
    if (!w) {
        ct_error_set(CT_ERR_NOMEM, "pg: out of memory for a work");
        return NULL;
    }
    if (uv_mutex_init(&w->mu)) {
        free(w);
        ct_error_set(CT_ERR_INTERNAL, "pg: uv_mutex_init failed");
        return NULL;
    }
    if (uv_cond_init(&w->cv)) {
        uv_mutex_destroy(&w->mu);
        free(w);
        ct_error_set(CT_ERR_INTERNAL, "pg: uv_cond_init failed");
        return NULL;
    }
    w->refs = 2;
    return w;
}

void cti_work_complete(ct_work *w, ct_status st, const char *msg)
{
    uv_mutex_lock(&w->mu);
    CT_ASSERT(!w->done);
    w->status = st;
    snprintf(w->msg, sizeof w->msg, "%s", msg ? msg : "");
    w->t_end = (double)uv_hrtime() * 1e-9;
    w->done = true;
    uv_cond_broadcast(&w->cv);
    uv_mutex_unlock(&w->mu);
}

void cti_work_unref(ct_work *w)
{
    if (__atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL)) return;
    ct_tensor_release(w->t_out);
    ct_tensor_release(w->t_in);
    uv_cond_destroy(&w->cv);
    uv_mutex_destroy(&w->mu);
    free(w);
}

/* Copies the outcome out under the lock; the caller sets its thread's error. */
static ct_status outcome(ct_work *w, char *msg, size_t cap)
{
    ct_status st = w->status;
    if (st) snprintf(msg, cap, "%s", w->msg);
    return st;
}

static ct_status report(ct_status st, const char *msg)
{
    return st ? ct_error_set(st, "%s", msg) : CT_OK;
}

ct_status ct_work_wait(ct_work *w)
{
    if (!w) return ct_error_set(CT_ERR_INVALID, "ct_work_wait: NULL work");
    cti_pg_run_deferred(w, INFINITY);
    char msg[CT_COMM_MSG];
    uv_mutex_lock(&w->mu);
    while (!w->done) uv_cond_wait(&w->cv, &w->mu);
    ct_status st = outcome(w, msg, sizeof msg);
    uv_mutex_unlock(&w->mu);
    return report(st, msg);
}

ct_status ct_work_run(ct_work *w)
{
    ct_status st = w ? ct_work_wait(w) : ct_last_status();
    ct_work_free(w);
    return st;
}

ct_status ct_work_wait_timeout(ct_work *w, double seconds)
{
    if (!w) return ct_error_set(CT_ERR_INVALID, "ct_work_wait_timeout: NULL work");
    if (!(seconds >= 0)) return ct_error_set(CT_ERR_INVALID, "ct_work_wait_timeout: seconds = %g, want >= 0", seconds);
    uint64_t deadline = uv_hrtime() + (uint64_t)fmin(seconds * 1e9, 1e18);
    /* a direct allreduce waits for the other ranks until the deadline, then keeps */
    if (cti_pg_run_deferred(w, (double)deadline * 1e-9) == CT_ERR_TIMEOUT)
        return ct_error_set(CT_ERR_TIMEOUT, "ct_work_wait_timeout: not complete after %g s (it keeps running)",
                            seconds);
    char msg[CT_COMM_MSG];
    uv_mutex_lock(&w->mu);
    while (!w->done) {
        uint64_t now = uv_hrtime();
        if (now >= deadline) break;
        uv_cond_timedwait(&w->cv, &w->mu, deadline - now); /* wakes early or times out: the loop decides */
    }
    bool done = w->done;
    ct_status st = done ? outcome(w, msg, sizeof msg) : CT_OK;
    uv_mutex_unlock(&w->mu);
    if (!done)
        return ct_error_set(CT_ERR_TIMEOUT, "ct_work_wait_timeout: not complete after %g s (it keeps running)",
                            seconds);
    return report(st, msg);
}

ct_status ct_work_test(ct_work *w, bool *done)
{
    if (!w || !done) return ct_error_set(CT_ERR_INVALID, "ct_work_test: NULL %s", w ? "done" : "work");
    cti_pg_run_deferred(w, (double)uv_hrtime() * 1e-9); /* when every rank is there already */
    char msg[CT_COMM_MSG];
    uv_mutex_lock(&w->mu);
    *done = w->done;
    ct_status st = w->done ? outcome(w, msg, sizeof msg) : CT_OK;
    uv_mutex_unlock(&w->mu);
    return report(st, msg);
}

void ct_work_free(ct_work *w)
{
    if (!w) return;
    cti_pg_run_deferred(w, INFINITY);
    uv_mutex_lock(&w->mu);
    while (!w->done) uv_cond_wait(&w->cv, &w->mu);
    uv_mutex_unlock(&w->mu);
    cti_work_unref(w);
}

/* ---- names ------------------------------------------------------------------------------ */

const char *cti_comm_op_name(int op)
{
    static const char *const names[CT_OP_COUNT] = {
        [CT_OP_INIT] = "init",           [CT_OP_NEW_SUBGROUP] = "new_subgroup",
        [CT_OP_ALLREDUCE] = "allreduce", [CT_OP_REDUCE_SCATTER] = "reduce_scatter",
        [CT_OP_ALLGATHER] = "allgather", [CT_OP_BROADCAST] = "broadcast",
        [CT_OP_REDUCE] = "reduce",       [CT_OP_GATHER] = "gather",
        [CT_OP_SCATTER] = "scatter",     [CT_OP_ALL_TO_ALL] = "all_to_all",
        [CT_OP_BARRIER] = "barrier",     [CT_OP_SEND] = "send",
        [CT_OP_RECV] = "recv",
    };
    return op > 0 && op < CT_OP_COUNT ? names[op] : "unknown-op";
}

const char *ct_reduce_op_name(ct_reduce_op op)
{
    switch (op) {
    case CT_REDUCE_SUM: return "sum";
    case CT_REDUCE_MEAN: return "avg";
    case CT_REDUCE_MAX: return "max";
    case CT_REDUCE_MIN: return "min";
    default: break;
    }
    return "invalid";
}

static bool has_reduction(int op) { return op == CT_OP_ALLREDUCE || op == CT_OP_REDUCE_SCATTER || op == CT_OP_REDUCE; }

static bool has_root(int op)
{
    return op == CT_OP_BROADCAST || op == CT_OP_REDUCE || op == CT_OP_GATHER || op == CT_OP_SCATTER;
}

const char *cti_comm_sig_str(char *buf, size_t cap, int op, int rop, int dtype, int64_t count, int root)
{
    const char *name = cti_comm_op_name(op);
    if (op == CT_OP_BARRIER)
        snprintf(buf, cap, "barrier()");
    else if (op == CT_OP_INIT)
        snprintf(buf, cap, "init(%lld ranks)", (long long)count);
    else if (op == CT_OP_NEW_SUBGROUP)
        snprintf(buf, cap, "new_subgroup(%lld ranks, list hash %08x)", (long long)count, (unsigned)root);
    else if (has_reduction(op) && has_root(op))
        snprintf(buf, cap, "%s(%s, %s, %lld, root %d)", name, ct_reduce_op_name((ct_reduce_op)rop),
                 ct_dtype_name((ct_dtype)dtype), (long long)count, root);
    else if (has_reduction(op))
        snprintf(buf, cap, "%s(%s, %s, %lld)", name, ct_reduce_op_name((ct_reduce_op)rop),
                 ct_dtype_name((ct_dtype)dtype), (long long)count);
    else if (has_root(op))
        snprintf(buf, cap, "%s(%s, %lld, root %d)", name, ct_dtype_name((ct_dtype)dtype), (long long)count, root);
    else
        snprintf(buf, cap, "%s(%s, %lld)", name, ct_dtype_name((ct_dtype)dtype), (long long)count);
    return buf;
}

const char *cti_comm_work_title(char *buf, size_t cap, const ct_work *w)
{
    if (w->op == CT_OP_SEND || w->op == CT_OP_RECV) {
        snprintf(buf, cap, "%s #%llu %s rank %d (tag %d, %s, %lld)", cti_comm_op_name(w->op),
                 (unsigned long long)w->seq, w->op == CT_OP_SEND ? "to" : "from", w->root, w->tag,
                 ct_dtype_name(w->dtype), (long long)w->count);
        return buf;
    }
    char sig[160];
    cti_comm_sig_str(sig, sizeof sig, w->op, w->rop, w->dtype, w->count, w->root);
    /* "allreduce #7 (sum, f32, 1000)": the signature's arguments after the number */
    const char *args = strchr(sig, '(');
    size_t alen = strlen(args);
    if (alen <= 2)
        snprintf(buf, cap, "%s #%llu", cti_comm_op_name(w->op), (unsigned long long)w->seq);
    else
        snprintf(buf, cap, "%s #%llu (%.*s)", cti_comm_op_name(w->op), (unsigned long long)w->seq, (int)alen - 2,
                 args + 1);
    return buf;
}

double ct_work_end_time(const ct_work *w)
{
    if (!w) return 0;
    ct_work *m = (ct_work *)w; /* the mutex, not the work, changes */
    uv_mutex_lock(&m->mu);
    double t = m->done ? m->t_end : 0;
    uv_mutex_unlock(&m->mu);
    return t;
}
