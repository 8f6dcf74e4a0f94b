/* ctrain — frames: autorelease pools for tensor temporaries.
 *
 * Every tensor-returning function registers its new reference in the innermost
 * frame of the calling thread. Popping a frame releases every reference
 * registered in it, so a training step written as
 *     CT_FRAME { ... ops ... }
 * frees all its temporaries at the closing brace. ct_keep(t) moves one
 * reference out to the enclosing frame. Each thread has a root frame that is
 * never popped; references registered there live until ct_frame_reset_root()
 * or thread exit.
 *
 * Do not `return`, `break` or `goto` out of a CT_FRAME block: the pop would be
 * skipped. Use ct_frame_push/ct_frame_pop explicitly in such code.
 */
#ifndef CT_CORE_FRAME_H
#define CT_CORE_FRAME_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/api.h"
#include "core/tensor.h"

/* Opens a frame; returns its depth (root = 0). */
CT_API int ct_frame_push(void);
/* Releases everything registered since the matching push. Popping the root does nothing. */
CT_API void ct_frame_pop(void);
/* Depth of this thread's innermost frame (root = 0). */
CT_API int ct_frame_depth(void);
/* Registers a new reference in the current frame; returns t. Used by constructors. */
CT_API ct_tensor *ct_frame_adopt(ct_tensor *t);
/* Hands one reference to t to the enclosing frame, so it survives the current
 * pop. Returns t. At the root frame it is a no-op. */
CT_API ct_tensor *ct_keep(ct_tensor *t);
/* Number of references held by the current frame (tests use it). */
CT_API int64_t ct_frame_size(void);
/* Releases everything in this thread's root frame. */
CT_API void ct_frame_reset_root(void);

#define CT_FRAME_CONCAT_(a, b) a##b
#define CT_FRAME_CONCAT(a, b) CT_FRAME_CONCAT_(a, b)
#define CT_FRAME                                                                        \
    for (int CT_FRAME_CONCAT(ct_frame_once_, __LINE__) = (ct_frame_push(), 1);          \
         CT_FRAME_CONCAT(ct_frame_once_, __LINE__);                                     \
         CT_FRAME_CONCAT(ct_frame_once_, __LINE__) = 0, ct_frame_pop())

#ifdef __cplusplus
}
#endif

#endif
