/* The names used in messages: ops, reduce ops, signatures and work titles, the same
 * on every rank so a desync message reads alike wherever it is reported. They belong
 * to the engine (they read the request fields of its works), not to the request. */
#include <stdio.h>
#include <string.h>

#include "dist/comm_internal.h"

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
