#include "core/dtype.h"

#include <string.h>

static const struct {
    const char *name, *st_name;
    size_t size;
    bool is_float;
} dtype_info[CT_DTYPE_COUNT] = {
    [CT_DTYPE_F32] = {"f32", "F32", 4, true},
    [CT_DTYPE_F64] = {"f64", "F64", 8, true},
    [CT_DTYPE_F16] = {"f16", "F16", 2, true},
    [CT_DTYPE_BF16] = {"bf16", "BF16", 2, true},
    [CT_DTYPE_F8_E4M3] = {"f8_e4m3", "F8_E4M3", 1, true},
    [CT_DTYPE_F8_E5M2] = {"f8_e5m2", "F8_E5M2", 1, true},
    [CT_DTYPE_I32] = {"i32", "I32", 4, false},
    [CT_DTYPE_I64] = {"i64", "I64", 8, false},
    [CT_DTYPE_U8] = {"u8", "U8", 1, false},
    [CT_DTYPE_BOOL] = {"bool", "BOOL", 1, false},
};

bool ct_dtype_is_valid(ct_dtype dt) { return (unsigned)dt < CT_DTYPE_COUNT; }

size_t ct_dtype_size(ct_dtype dt) { return ct_dtype_is_valid(dt) ? dtype_info[dt].size : 0; }

const char *ct_dtype_name(ct_dtype dt) { return ct_dtype_is_valid(dt) ? dtype_info[dt].name : "invalid"; }

const char *ct_dtype_safetensors_name(ct_dtype dt)
{
    return ct_dtype_is_valid(dt) ? dtype_info[dt].st_name : "INVALID";
}

bool ct_dtype_is_float(ct_dtype dt) { return ct_dtype_is_valid(dt) && dtype_info[dt].is_float; }

bool ct_dtype_parse(const char *name, ct_dtype *out)
{
    if (!name) return false;
    for (int i = 0; i < CT_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0 || strcmp(name, dtype_info[i].st_name) == 0) {
            *out = (ct_dtype)i;
            return true;
        }
    }
    return false;
}
