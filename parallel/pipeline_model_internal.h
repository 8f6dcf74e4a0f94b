/* A model's pipeline stage: what pipeline_model.c (the part common to every model)
 * shares with pipeline_gpt.c and pipeline_llama.c (each model's part). */
#ifndef CT_PARALLEL_PIPELINE_MODEL_INTERNAL_H
#define CT_PARALLEL_PIPELINE_MODEL_INTERNAL_H

#include <stdbool.h>

#include "parallel/pipeline_model.h"

/* What a model gives the common part. */
typedef struct cti_pp_model_ops {
    const char *op;          /* "pipeline_gpt": the prefix of its messages */
    ct_module *root;         /* the model's root module (its parameters' names) */
    int num_layers;
    int64_t max_seq;         /* the longest T, or 0 for no limit */
    const char *tied_name;   /* the tied embedding's dotted name, NULL when untied */
    /* whether the parameter with this dotted name belongs to the stage */
    bool (*owns)(const ct_pipeline_model *pm, const char *name);
    /* the stage's part for one micro-batch: tokens (B, T) on stage 0, else the hidden
     * states from the previous stage -> hidden states (B, T, C), or the logits
     * (B, T, V) on the last stage (new reference, current frame); a tensor-parallel
     * model: its sequence chunk, its vocabulary columns */
    ct_tensor *(*forward)(const ct_pipeline_model *pm, ct_tensor *x);
    /* the last stage's logits against the targets -> the mean cross-entropy */
    ct_tensor *(*loss)(const ct_pipeline_model *pm, ct_tensor *logits, ct_tensor *targets);
    /* A model sharded for tensor parallelism (NULL otherwise): its group, whether a
     * parameter is a shard (else replicated over tp), and the sync of sequence
     * parallelism's partial gradients over tp (the model's own). */
    ct_pg *tp;
    bool (*sharded)(const ct_pipeline_model *pm, const ct_tensor *param);
    ct_status (*sync_tp)(const ct_pipeline_model *pm);
} cti_pp_model_ops;

struct ct_pipeline_model {
    cti_pp_model_ops ops;
    void *model;
    int stage, num_stages, first, count;
    ct_pipeline *pp;
    ct_pg *all;          /* the engine-independent group over the stages (norms); NULL for one stage */
    ct_pg *tied_group;   /* stages {0, last} when tied and more than one stage; NULL elsewhere */
    ct_tensor *tied;     /* the tied weight on a member of tied_group (borrowed), else NULL */
    ct_param_list params;
    /* the current step */
    ct_tensor **targets; /* num_micro views of the targets */
};

/* The common constructor: the layers, the groups, the parameter list, the engine. */
ct_pipeline_model *cti_pipeline_model_new(const cti_pp_model_ops *ops, void *model, ct_pg *stages, int stage,
                                          const ct_pipeline_config *cfg);

/* Whether the dotted name is "<prefix><i>.…" for a layer i of the stage. */
bool cti_pipeline_model_owns_layer(const ct_pipeline_model *pm, const char *name, const char *prefix);

#endif
