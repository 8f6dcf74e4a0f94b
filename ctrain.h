/* ctrain — umbrella header: includes every public header.
 *
 *   core/     tensors, dtypes, devices, storage, frames, errors, RNG, safetensors, threads
 *   kernels/  tensor-level kernels dispatched per device (ct_kernel_*)
 */
#ifndef CTRAIN_H
#define CTRAIN_H

#include "core/convert.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "core/threads.h"

#include "kernels/attention.h"
#include "kernels/dispatch.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"

#endif
