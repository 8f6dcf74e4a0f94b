/* ctrain — element types.
 *
 * Every tensor has one dtype. Floating types convert with round-to-nearest-even;
 * the fp8 formats follow the OCP 8-bit floating point specification (OFP8):
 *   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448, no infinity,
 *         NaN = S.1111.111 (0x7F / 0xFF).
 *   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; max 57344, IEEE-like
 *         infinities (S.11111.00) and NaNs (S.11111.{01,10,11}).
 */
#ifndef CT_CORE_DTYPE_H
#define CT_CORE_DTYPE_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/api.h"

typedef enum ct_dtype {
    CT_DTYPE_F32 = 0,
    CT_DTYPE_F64,
    CT_DTYPE_F16,
    CT_DTYPE_BF16,
    CT_DTYPE_F8_E4M3,
    CT_DTYPE_F8_E5M2,
    CT_DTYPE_I32,
    CT_DTYPE_I64,
    CT_DTYPE_U8,
    CT_DTYPE_BOOL,
    CT_DTYPE_COUNT
} ct_dtype;

/* Bytes per element; 0 for an invalid dtype. */
CT_API size_t ct_dtype_size(ct_dtype dt);
/* Lower-case name ("f32", "bf16", "f8_e4m3", ...); "invalid" for a bad value. */
CT_API const char *ct_dtype_name(ct_dtype dt);
/* The safetensors spelling ("F32", "BF16", "F8_E4M3", "BOOL", ...). */
CT_API const char *ct_dtype_safetensors_name(ct_dtype dt);
/* Parses either spelling; returns false when the name is unknown. */
CT_API bool ct_dtype_parse(const char *name, ct_dtype *out);
/* True for one of the ten dtypes. */
CT_API bool ct_dtype_is_valid(ct_dtype dt);
/* True for f32, f64, f16, bf16 and the two fp8 formats. */
CT_API bool ct_dtype_is_float(ct_dtype dt);

#ifdef __cplusplus
}
#endif

#endif
