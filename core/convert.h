/* ctrain — conversions between element types.
 *
 * Formats (v = (-1)^s * 2^(e - bias) * (1 + m / 2^M); e = 0 is subnormal:
 * v = (-1)^s * 2^(1 - bias) * (m / 2^M)):
 *   f16   IEEE binary16: 5 exponent bits, bias 15, M = 10; max 65504.
 *   bf16  the top half of an f32: 8 exponent bits, bias 127, M = 7.
 *   E4M3  OCP FP8: 4 exponent bits, bias 7, M = 3; max 448 (0x7E); no infinity;
 *         NaN = S.1111.111 only; min subnormal 2^-9.
 *   E5M2  OCP FP8: 5 exponent bits, bias 15, M = 2; max 57344 (0x7B);
 *         inf = S.11111.00, NaN = S.11111.{01,10,11}; min subnormal 2^-16.
 *         (E5M2 is exactly the top byte of an f16.)
 *
 * Narrowing rounds to nearest, ties to even, once, straight from the source
 * value (f64 and i64 sources are never rounded through f32). Signed zeros are
 * kept. A finite value that rounds above the largest finite value overflows:
 *   f16, bf16          -> inf
 *   E4M3               -> NaN (0x7F | sign), or max finite with sign when saturating
 *   E5M2               -> inf,               or max finite with sign when saturating
 * An infinite input follows the same rule. A NaN input gives a NaN: the sign and
 * the top payload bits are kept and the quiet bit is set (what x86 F16C does);
 * E4M3 has a single NaN, 0x7F | sign.
 *
 * Widening (f16, bf16, E4M3, E5M2 -> f32) is exact; NaNs come back quiet.
 *
 * All functions are pure and thread-safe.
 */
#ifndef CT_CORE_CONVERT_H
#define CT_CORE_CONVERT_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/dtype.h"
#include "core/error.h"

/* An IEEE binary16 bit pattern as f32 (exact). */
CT_API float ct_f16_to_f32(uint16_t h);
/* f to binary16, round to nearest even; overflow gives inf. */
CT_API uint16_t ct_f32_to_f16(float f);
/* A bf16 bit pattern as f32 (exact). */
CT_API float ct_bf16_to_f32(uint16_t h);
/* f to bf16, round to nearest even; overflow gives inf. */
CT_API uint16_t ct_f32_to_bf16(float f);
/* An OCP E4M3 byte as f32 (exact). */
CT_API float ct_e4m3_to_f32(uint8_t v);
/* f to E4M3, round to nearest even; overflow gives NaN, or +-448 when saturate. */
CT_API uint8_t ct_f32_to_e4m3(float f, bool saturate);
/* An OCP E5M2 byte as f32 (exact). */
CT_API float ct_e5m2_to_f32(uint8_t v);
/* f to E5M2, round to nearest even; overflow gives inf, or +-57344 when saturate. */
CT_API uint8_t ct_f32_to_e5m2(float f, bool saturate);

/* From f64, rounding once to the target. */
CT_API uint16_t ct_f64_to_f16(double d);
CT_API uint16_t ct_f64_to_bf16(double d);
CT_API uint8_t ct_f64_to_e4m3(double d, bool saturate);
CT_API uint8_t ct_f64_to_e5m2(double d, bool saturate);

/* Converts n contiguous elements of src_dt at src into dst_dt at dst (caller-owned
 * buffers, which must not overlap).
 *   float -> float   RNE as above; `saturate` applies to fp8 targets only.
 *   float -> int     truncate toward zero, saturate to the target's range, NaN -> 0.
 *   int   -> int     two's complement wrap, as a C cast.
 *   any   -> bool    nonzero (NaN included) -> 1, zero -> 0.
 *   bool/int -> float  RNE (bool source bytes: nonzero reads as 1).
 *   same dtype       memcpy.
 * Returns CT_OK, or CT_ERR_INVALID (bad dtype, n < 0, NULL buffer with n > 0,
 * overlapping buffers) with a message naming both dtypes; nothing is written then. */
CT_API ct_status ct_convert_n(ct_dtype dst_dt, void *dst, ct_dtype src_dt, const void *src, int64_t n,
                              bool saturate);

/* One element of dtype dt at p, exactly as a double (i64 beyond 2^53 rounds to
 * nearest even). Invalid dtype: records an error and returns NaN. */
CT_API double ct_scalar_load(ct_dtype dt, const void *p);
/* Writes v as one element of dtype dt at p, with the ct_convert_n rules (fp8
 * non-saturating). Invalid dtype: records an error and writes nothing. */
CT_API void ct_scalar_store(ct_dtype dt, void *p, double v);

#ifdef __cplusplus
}
#endif

#endif
