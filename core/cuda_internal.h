/* ctrain — what the CUDA device layer gives the rest of the library (internal).
 *
 * Only meaningful in a build with CT_HAVE_CUDA; plain C, so both the C files of core and
 * the .cu files (core/, kernels/cuda/) include it. Streams are passed as void *
 * (a cudaStream_t) so that this header needs no CUDA header.
 *
 * A kernel family's device function follows one pattern:
 *     cudaStream_t st = (cudaStream_t)cti_cuda_stream(y->device.index);
 *     my_kernel<<<grid, block, 0, st>>>(...);
 *     return cti_cuda_launched("softmax", y);
 * cti_cuda_launched checks the launch (cudaGetLastError), remembers the op for an
 * asynchronous error found later, and under CTRAIN_CUDA_SYNC=1 waits for the kernel
 * and reports its error at once, naming the op, shapes, dtypes and device.
 */
#ifndef CT_CORE_CUDA_INTERNAL_H
#define CT_CORE_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/cuda.h"
#include "core/error.h"
#include "core/tensor.h"

/* Makes dev the calling thread's current CUDA device (cudaSetDevice, only when it
 * changes). CT_OK or an error naming op and the device. */
ct_status cti_cuda_enter(int dev, const char *op);
/* The calling thread's current stream on dev (a cudaStream_t), after
 * cti_cuda_enter(dev). Never NULL once the device is initialised. */
void *cti_cuda_stream(int dev);
/* The device's default compute stream (the one every thread starts on). */
void *cti_cuda_default_stream(int dev);

/* err is a cudaError_t. CT_OK for cudaSuccess; else records
 * "op: CUDA error cudaErrorX (text) <what> on cuda:dev" and returns CT_ERR_DEVICE (out of memory: CT_ERR_NOMEM)
 * (an asynchronous error also lists the ops launched since the last sync). */
ct_status cti_cuda_check(int err, const char *op, int dev, const char *what);
/* The same for a cublasStatus_t. */
ct_status cti_cublas_check(int status, const char *op, int dev, const char *what);

/* After a kernel launch on t's device for op; t describes the launch in messages
 * (the output, usually). See the top of this file. */
ct_status cti_cuda_launched(const char *op, const ct_tensor *t);
/* Remembers an op queued on dev (copies, library calls) for asynchronous error
 * reports, without checking anything. */
void cti_cuda_note_op(const char *op, int dev, const char *what);
/* True under CTRAIN_CUDA_SYNC=1. */
bool cti_cuda_sync_mode(void);

/* Device memory from the caching allocator for stream (a cudaStream_t; NULL: the
 * current stream): n bytes on dev, at least 256-byte aligned. NULL + an
 * out-of-memory error naming op, the request and the device's counters. *cap
 * receives the block's capacity (what cti_cuda_free needs). */
void *cti_cuda_malloc(int dev, size_t n, void *stream, size_t *cap, const char *op);
/* Gives the block back to its stream's free list: reusable at once on that stream
 * (stream order), by another stream only after the work queued now has finished. */
void cti_cuda_free(int dev, void *p, size_t cap);

/* Pinned host staging for copies between host and device: copies n bytes.
 * dir: 0 host -> device, 1 device -> host; stream as above. The device -> host copy
 * returns after the bytes are on the host (and reports asynchronous errors). */
ct_status cti_cuda_copy_host(int dev, void *dst, const void *src, size_t n, int dir, void *stream,
                             const char *op);

/* The tensor-level helpers core/copy.c and core/tensor.c call for tensors on a GPU
 * (core/cuda_copy.cu). dst and src on GPUs (the same one, or peers); any dtypes,
 * any strides, src broadcast to dst's shape by 0 strides (already checked). */
ct_status cti_cuda_copy_strided(ct_tensor *dst, const ct_tensor *src, const int64_t *src_strides, bool saturate);
/* Every element of t (any strides) set to value (converted as ct_scalar_store). */
ct_status cti_cuda_fill(ct_tensor *t, double value);

#ifdef __cplusplus
}
#endif

#endif
