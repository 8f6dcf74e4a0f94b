/* ctrain — umbrella header: includes every public header, layer by layer.
 *
 *   core/      tensors, dtypes, devices, storage, frames, errors, RNG, safetensors, threads
 *   kernels/   tensor-level kernels dispatched per device (ct_kernel_*)
 *   precision/ autocast policy, fp16 loss scaler, fp8 formats and delayed scaling
 *   autograd/  differentiable ops (ct_matmul, ct_softmax, ...), backward, hooks, gradcheck
 *   nn/        modules with named parameters, layers, GPT, Llama, HF model directories,
 *              tensor-parallel ops and layers (Megatron-LM)
 *   optim/     SGD, Adam, AdamW, LR schedules, gradient clipping
 *   data/      datasets, token files, byte and BPE tokenizers, data loader
 *   dist/      launcher environment, rendezvous store, process groups, work requests
 *   parallel/  training strategies: DDP, the sharding engine (ZeRO-1/2/3, hybrid, offload),
 *              the device mesh, pipelines
 *   accel/     the Accelerator, its DeepSpeed and FSDP plugins, ds_config.json, training-state checkpoints
 *
 * Only what these headers declare with CT_API is exported by libctrain.so; the
 * *_internal.h headers and kernels/cpu/ are the library's own.
 */
#ifndef CTRAIN_H
#define CTRAIN_H

#include "core/api.h"
#include "core/convert.h"
#include "core/cuda.h"
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
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/foreach.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"

#include "precision/autocast.h"
#include "precision/fp8.h"
#include "precision/fp8_state.h"
#include "precision/loss_scaler.h"

#include "autograd/autocast_cast.h"
#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "autograd/ops_fp8.h"
#include "autograd/ops.h"
#include "autograd/ops_math.h"
#include "autograd/ops_nn.h"
#include "autograd/ops_shape.h"

#include "nn/generate.h"
#include "nn/gpt.h"
#include "nn/hf_weights.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/llama.h"
#include "nn/lm.h"
#include "nn/module.h"
#include "nn/tp_ops.h"
#include "nn/tp_layers.h"

#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

#include "data/dataset.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "data/bpe.h"
#include "data/bpe_train.h"
#include "data/tokenizer.h"

#include "dist/env.h"
#include "dist/pg.h"
#include "dist/store.h"
#include "dist/work.h"

#include "parallel/ddp.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_model.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/shard.h"
#include "parallel/shard_flat.h"
#include "parallel/shard_plan.h"
#include "parallel/shard_state.h"

#include "accel/accelerator.h"
#include "accel/checkpoint.h"
#include "accel/ds_config.h"
#include "accel/plugins.h"

#endif
