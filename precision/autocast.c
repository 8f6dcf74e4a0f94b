/* Autocast scopes (per thread) and the policy table (per process); the rules are in
 * precision/autocast.h. */
#include <stdatomic.h>
#include <stdio.h>

#include "precision/autocast_internal.h"

#define MAX_DEPTH 16

static _Thread_local ct_dtype scope_dt[MAX_DEPTH]; /* CT_DTYPE_F32: a scope that turns autocast off */
static _Thread_local ct_fp8_state *scope_fp8[MAX_DEPTH]; /* NULL: no fp8 in the scope */
static _Thread_local int depth;
static _Atomic int default_dt = CT_DTYPE_F32; /* the process's level below every scope */
static _Atomic(ct_fp8_state *) default_fp8;

static const ct_autocast_rule DEFAULTS[CT_AC_OP_COUNT] = {
    [CT_AC_MATMUL] = CT_AC_LOW,     [CT_AC_LINEAR] = CT_AC_FP8,         [CT_AC_ATTENTION] = CT_AC_LOW,
    [CT_AC_SOFTMAX] = CT_AC_F32,    [CT_AC_LOG_SOFTMAX] = CT_AC_F32,    [CT_AC_LAYERNORM] = CT_AC_F32,
    [CT_AC_RMSNORM] = CT_AC_F32,    [CT_AC_CROSS_ENTROPY] = CT_AC_F32,  [CT_AC_REDUCTION] = CT_AC_F32,
    [CT_AC_BINARY] = CT_AC_WIDEST,
};

static _Atomic int rules[CT_AC_OP_COUNT] = {
    [CT_AC_MATMUL] = CT_AC_LOW,     [CT_AC_LINEAR] = CT_AC_FP8,         [CT_AC_ATTENTION] = CT_AC_LOW,
    [CT_AC_SOFTMAX] = CT_AC_F32,    [CT_AC_LOG_SOFTMAX] = CT_AC_F32,    [CT_AC_LAYERNORM] = CT_AC_F32,
    [CT_AC_RMSNORM] = CT_AC_F32,    [CT_AC_CROSS_ENTROPY] = CT_AC_F32,  [CT_AC_REDUCTION] = CT_AC_F32,
    [CT_AC_BINARY] = CT_AC_WIDEST,
};

static atomic_ulong generation = 1;

static bool scope_dtype_ok(ct_dtype dt) { return dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16 || dt == CT_DTYPE_F32; }

ct_status ct_autocast_set_default(ct_dtype dt)
{
    if (!scope_dtype_ok(dt))
        return ct_error_set(CT_ERR_INVALID, "autocast_set_default: %s is not bf16, f16 or f32 (off)",
                            ct_dtype_is_valid(dt) ? ct_dtype_name(dt) : "an invalid dtype");
    atomic_store(&default_dt, (int)dt);
    if (dt == CT_DTYPE_F32) atomic_store(&default_fp8, NULL);
    return CT_OK;
}

void ct_autocast_set_default_fp8(ct_fp8_state *st)
{
    if (st) atomic_store(&default_dt, (int)CT_DTYPE_BF16);
    atomic_store(&default_fp8, st);
}

/* The dtype in force: the innermost scope's, else the process default. */
static ct_dtype current(void) { return depth > 0 ? scope_dt[depth - 1] : (ct_dtype)atomic_load(&default_dt); }

ct_status ct_autocast_begin(ct_dtype dt)
{
    if (!scope_dtype_ok(dt))
        return ct_error_set(CT_ERR_INVALID, "autocast_begin: %s is not an autocast dtype (bf16 or f16; f32 turns "
                            "autocast off inside the scope)",
                            ct_dtype_is_valid(dt) ? ct_dtype_name(dt) : "an invalid dtype");
    if (depth == MAX_DEPTH)
        return ct_error_set(CT_ERR_UNSUPPORTED, "autocast_begin: more than %d nested scopes (is an end missing?)",
                            MAX_DEPTH);
    scope_fp8[depth] = NULL;
    scope_dt[depth++] = dt;
    return CT_OK;
}

ct_status ct_autocast_begin_fp8(ct_fp8_state *st)
{
    if (!st) return ct_error_set(CT_ERR_INVALID, "autocast_begin_fp8: the fp8 state is NULL");
    ct_status rc = ct_autocast_begin(CT_DTYPE_BF16);
    if (!rc) scope_fp8[depth - 1] = st;
    return rc;
}

ct_fp8_state *ct_autocast_fp8_state(void)
{
    return depth > 0 ? scope_fp8[depth - 1] : atomic_load(&default_fp8);
}

void ct_autocast_end(void)
{
    if (depth > 0) depth--;
}

bool ct_autocast_enabled(void) { return current() != CT_DTYPE_F32; }

ct_dtype ct_autocast_dtype(void) { return current(); }

int ct_autocast_depth(void) { return depth; }

ct_autocast_rule ct_autocast_rule_of(ct_autocast_op op)
{
    return (unsigned)op < CT_AC_OP_COUNT ? (ct_autocast_rule)atomic_load(&rules[op]) : CT_AC_AS_IS;
}

ct_status ct_autocast_set_rule(ct_autocast_op op, ct_autocast_rule rule)
{
    if ((unsigned)op >= CT_AC_OP_COUNT)
        return ct_error_set(CT_ERR_INVALID, "autocast_set_rule: op %d is not an autocast op (0 .. %d)", (int)op,
                            CT_AC_OP_COUNT - 1);
    if ((unsigned)rule > CT_AC_FP8)
        return ct_error_set(CT_ERR_INVALID, "autocast_set_rule: rule %d for %s is not as_is, low, f32, widest or fp8",
                            (int)rule, ct_autocast_op_name(op));
    atomic_store(&rules[op], (int)rule);
    return CT_OK;
}

void ct_autocast_reset_rules(void)
{
    for (int i = 0; i < CT_AC_OP_COUNT; i++) atomic_store(&rules[i], (int)DEFAULTS[i]);
}

const char *ct_autocast_op_name(ct_autocast_op op)
{
    static const char *const names[CT_AC_OP_COUNT] = {
        [CT_AC_MATMUL] = "matmul",         [CT_AC_LINEAR] = "linear",       [CT_AC_ATTENTION] = "attention",
        [CT_AC_SOFTMAX] = "softmax",       [CT_AC_LOG_SOFTMAX] = "log_softmax", [CT_AC_LAYERNORM] = "layernorm",
        [CT_AC_RMSNORM] = "rmsnorm",       [CT_AC_CROSS_ENTROPY] = "cross_entropy",
        [CT_AC_REDUCTION] = "reductions (sum, mean, var)",
        [CT_AC_BINARY] = "binary elementwise (add, sub, mul, div, pow, maximum, minimum)",
    };
    return (unsigned)op < CT_AC_OP_COUNT ? names[op] : "invalid";
}

const char *ct_autocast_rule_name(ct_autocast_rule rule)
{
    switch (rule) {
    case CT_AC_AS_IS: return "as_is";
    case CT_AC_LOW: return "low";
    case CT_AC_F32: return "f32";
    case CT_AC_WIDEST: return "widest";
    case CT_AC_FP8: return "fp8";
    }
    return "invalid";
}

const char *ct_autocast_policy_str(char *buf, int cap)
{
    int n = 0;
    buf[0] = '\0';
    for (int i = 0; i < CT_AC_OP_COUNT && n < cap; i++)
        n += snprintf(buf + n, (size_t)(cap - n), "%s: %s\n", ct_autocast_op_name((ct_autocast_op)i),
                      ct_autocast_rule_name(ct_autocast_rule_of((ct_autocast_op)i)));
    return buf;
}

static bool is_autocast_float(ct_dtype dt) { return dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16; }

ct_dtype ct_autocast_compute_dtype(ct_autocast_op op, ct_dtype in)
{
    ct_dtype dt = current();
    if (dt == CT_DTYPE_F32 || !is_autocast_float(in)) return in;
    switch (ct_autocast_rule_of(op)) {
    case CT_AC_LOW:
    case CT_AC_FP8: return dt; /* the fp8 product itself is the op's business (ct_autocast_fp8_for) */
    case CT_AC_F32: return CT_DTYPE_F32;
    default: return in;
    }
}

void ct_autocast_weights_changed(void) { atomic_fetch_add(&generation, 1); }

unsigned long cti_autocast_generation(void) { return atomic_load(&generation); }
