/* The pipeline engine's state and its transfer functions (pipeline_transfer.c),
 * shared by pipeline.c only. */
#ifndef CT_PARALLEL_PIPELINE_INTERNAL_H
#define CT_PARALLEL_PIPELINE_INTERNAL_H

#include <stdbool.h>

#include "parallel/pipeline.h"

/* Offsets from cfg.tag of the three point-to-point streams: each pair of stages has
 * its own counters per tag, so the n-th message of a stream is micro-batch n's. */
/* The header's kind of a forward-only run (a training run sends its schedule). */
enum { CTI_PP_KIND_EVAL = 100 };
enum { CTI_PP_TAG_HEADER = 0, CTI_PP_TAG_ACTIVATION = 1, CTI_PP_TAG_GRADIENT = 2 };

/* The header before each activation: what the receiver checks it against. */
enum { CTI_PP_HDR_MAGIC, CTI_PP_HDR_MICRO, CTI_PP_HDR_M, CTI_PP_HDR_KIND, CTI_PP_HDR_DTYPE, CTI_PP_HDR_NDIM,
       CTI_PP_HDR_SHAPE, CTI_PP_HDR_LEN = CTI_PP_HDR_SHAPE + CT_MAX_DIMS };
#define CTI_PP_MAGIC 0x70697065 /* "pipe" */

/* One micro-batch of the current run on this stage. Tensors are owned references;
 * a work's tensors are held by the work until it is freed. */
typedef struct cti_micro_slot {
    ct_tensor *in;       /* stage 0: the caller's input; else the received activation (a leaf) */
    ct_tensor *out;      /* the forward's output (the loss on the last stage) */
    ct_tensor *hdr_in;   /* the received header */
    ct_tensor *grad_in;  /* the received gradient of out */
    ct_work *hdr_recv, *act_recv, *grad_recv;
    ct_work *hdr_send, *act_send, *grad_send;
    int64_t bytes; /* boundary tensors held while live */
} cti_micro_slot;

struct ct_pipeline {
    ct_pipeline_config cfg;
    int stage, num_stages;
    ct_pipeline_forward_fn fwd;
    void *ctx;
    ct_pg *g; /* the engine's own group over the stages; NULL for one stage or once broken */

    /* the current run */
    int num_micro;
    cti_micro_slot *slots;
    double loss_sum;
    double grad_scale; /* the last stage seeds grad_scale / M (ct_pipeline_set_grad_scale) */
    bool eval;         /* the current run is forward-only (ct_pipeline_eval) */
    int live;
    int64_t live_bytes;
    bool exp_known; /* the activation's dtype and shape are known (configured or micro-batch 0's) */
    ct_dtype exp_dtype;
    int exp_ndim;
    int64_t exp_shape[CT_MAX_DIMS];

    ct_status broken;
    char broken_msg[1024];
    ct_pipeline_stats stats;
};

/* Seconds on the monotonic clock. */
double cti_pipeline_now(void);
/* Prefixes the current error with the stage, the micro-batch (none when < 0) and op;
 * returns its status. */
ct_status cti_pipeline_fail(ct_pipeline *p, int micro, const char *op);

/* Back to the configured expectation (or none) at the start of a run. */
void cti_pipeline_expect_reset(ct_pipeline *p);
/* Posts the receive of micro-batch m's header (and of its activation when the shape is
 * known); nothing if already posted. */
ct_status cti_pipeline_post_activation(ct_pipeline *p, int m);
/* Waits for m's header and activation, checks them; slots[m].in is then the leaf. */
ct_status cti_pipeline_take_activation(ct_pipeline *p, int m);
/* Sends slots[m].out with its header to the next stage and posts the receive of its
 * gradient (slots[m].grad_in). */
ct_status cti_pipeline_send_activation(ct_pipeline *p, int m);
/* Waits for the gradient of slots[m].out. */
ct_status cti_pipeline_take_gradient(ct_pipeline *p, int m);
/* Sends the gradient of slots[m].in to the previous stage (zeros when in got none). */
ct_status cti_pipeline_send_gradient(ct_pipeline *p, int m);
/* After m's backward: frees what m held, and the finished sends of earlier ones. */
ct_status cti_pipeline_slot_release(ct_pipeline *p, int m);
/* Waits for every send of the run. */
ct_status cti_pipeline_sends_wait(ct_pipeline *p);
/* Frees every work (they must not be pending on a live group) and tensor of the run. */
void cti_pipeline_slots_clear(ct_pipeline *p);

#endif
