/* ctrain — CPU optimizer updates on flat contiguous buffers (see kernels/optim.h for the
 * math). These are what the sharding engine calls on its flat shards: no tensors, no
 * checks beyond the pointers' contract below.
 *
 * p, g, m, v, buf each hold n elements and do not overlap. The fast versions compute
 * each element in its own precision with the step's scalars (bias corrections, step
 * size) worked out once in double; they are elementwise, so the result does not depend
 * on the thread count. The _ref versions do every operation in double, one element at
 * a time, for tests.
 */
#ifndef CT_KERNELS_CPU_OPTIM_H
#define CT_KERNELS_CPU_OPTIM_H

#include <stdint.h>

#include "kernels/optim.h"

void cti_cpu_adamw_f32(float *p, const float *g, float *m, float *v, int64_t n, const ct_adamw_hparams *h);
void cti_cpu_adamw_f32_ref(float *p, const float *g, float *m, float *v, int64_t n, const ct_adamw_hparams *h);
void cti_cpu_adamw_f64(double *p, const double *g, double *m, double *v, int64_t n, const ct_adamw_hparams *h);

/* buf: NULL when h->momentum == 0 (then it is never read); when momentum != 0 a NULL buf
 * makes the step run without momentum (ct_kernel_sgd reports that as an error instead). */
void cti_cpu_sgd_f32(float *p, const float *g, float *buf, int64_t n, const ct_sgd_hparams *h);
void cti_cpu_sgd_f32_ref(float *p, const float *g, float *buf, int64_t n, const ct_sgd_hparams *h);
void cti_cpu_sgd_f64(double *p, const double *g, double *buf, int64_t n, const ct_sgd_hparams *h);

/* Tensor-level device functions for the dispatch tables (dtype switch inside). */
ct_status cti_cpu_adamw(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
                        const ct_adamw_hparams *h);
ct_status cti_cpu_sgd(ct_tensor *param, const ct_tensor *grad, ct_tensor *momentum_buf,
                      const ct_sgd_hparams *h);

#endif
