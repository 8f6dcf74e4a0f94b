/* ctrain — modules: trees of named children, parameters and buffers.
 *
 * A module type embeds ct_module as its first member and adds typed fields:
 *
 *     typedef struct ct_linear { ct_module base; ct_tensor *weight, *bias; } ct_linear;
 *
 * Parameters and buffers are registered under local names; a tensor's full
 * name is the dotted path from the root ("h.0.attn.c_attn.weight"), as in
 * PyTorch's state_dict. The module owns one reference to each registered
 * tensor and to each child; ct_module_free releases the whole tree.
 * Registration order is kept everywhere (parameters(), state dicts), and a
 * tensor registered twice (tied weights) is listed once, under its first name.
 */
#ifndef CT_NN_MODULE_H
#define CT_NN_MODULE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/tensor.h"

typedef struct ct_module ct_module;

/* Frees the type's own fields (not the registered tensors or children, which
 * ct_module_free releases). May be NULL. */
typedef void (*ct_module_destroy_fn)(ct_module *m);

/* Forward hooks: what a wrapper (the sharding engine) runs around a module's forward.
 * pre runs before the module computes (non-zero fails the forward); post gets the
 * output (NULL when the forward failed) and returns what the forward returns: out
 * itself or a tensor standing for it (a new reference in the current frame). */
typedef struct ct_module_hooks {
    ct_status (*pre)(ct_module *m, void *data);
    ct_tensor *(*post)(ct_module *m, ct_tensor *out, void *data);
    void *data;
} ct_module_hooks;

/* A wrapper that computes a model's training loss itself instead of its forward: the
 * Accelerator's pipeline parallelism runs the forward and backward of every
 * micro-batch of the batch on this rank's stage and returns the batch's mean loss (a
 * value, no graph: backward already ran). The loss functions of the models that
 * support it (ct_gpt_loss, ct_llama_loss) hand their arguments to it when set. */
typedef ct_tensor *(*ct_module_loss_fn)(ct_module *m, ct_tensor *idx, ct_tensor *targets, void *data);
typedef struct ct_module_loss_runner {
    ct_module_loss_fn fn; /* NULL: none */
    void *data;
} ct_module_loss_runner;

typedef struct ct_module_entry {
    char *name;
    ct_tensor *tensor; /* owned reference */
} ct_module_entry;

struct ct_module {
    const char *type; /* "Linear", "Block", ... (static string) */
    bool training;
    ct_module_destroy_fn destroy;
    ct_module_entry *params, *buffers;
    int nparams, nbuffers;
    struct {
        char *name;
        ct_module *module; /* owned */
    } *children;
    int nchildren;
    ct_module_hooks hooks; /* all NULL: none */
    ct_module_loss_runner loss_runner; /* on a model's root module; fn NULL: none */
};

/* Allocates a module type of `size` bytes (zeroed) whose first member is a
 * ct_module, and initialises it. NULL + error when out of memory. */
CT_API void *ct_module_alloc(size_t size, const char *type, ct_module_destroy_fn destroy);
/* Initialises an embedded ct_module (zeroed memory): training mode on. */
CT_API void ct_module_init(ct_module *m, const char *type, ct_module_destroy_fn destroy);
/* Releases parameters, buffers and children, calls destroy, frees m (which
 * must have been malloc'ed as the start of its type's struct). NULL is fine. */
CT_API void ct_module_free(ct_module *m);

/* Registers t (one reference is taken) as parameter `name`; it is marked as
 * requiring grad. Names are unique within a module. */
CT_API ct_status ct_module_add_param(ct_module *m, const char *name, ct_tensor *t);
/* Registers t (one reference is taken) as buffer `name`: state saved with the module that is not trained. */
CT_API ct_status ct_module_add_buffer(ct_module *m, const char *name, ct_tensor *t);
/* Adds child under name; the parent owns it from now on (also on failure). */
CT_API ct_status ct_module_add_child(ct_module *m, const char *name, ct_module *child);

/* Installs h (copied) on m, or removes m's hooks with NULL. One set per module. */
CT_API void ct_module_set_hooks(ct_module *m, const ct_module_hooks *h);
/* Installs r (copied) as m's loss runner, or removes it with NULL. */
CT_API void ct_module_set_loss_runner(ct_module *m, const ct_module_loss_runner *r);
/* The brackets of every module type's forward, so that hooks run whoever calls it:
 *
 *     ct_tensor *my_forward(my_module *m, ct_tensor *x) {
 *         if (ct_module_forward_begin(&m->base)) return NULL;
 *         ct_tensor *y = ...;
 *         return ct_module_forward_end(&m->base, y);
 *     }
 *
 * Without hooks they cost a branch and return CT_OK and out. */
CT_API ct_status ct_module_forward_begin(ct_module *m);
CT_API ct_tensor *ct_module_forward_end(ct_module *m, ct_tensor *out);

/* Sets training (true) or evaluation (false) mode on the whole tree. */
CT_API void ct_module_train(ct_module *m, bool training);

/* A flat, ordered list of a tree's tensors with their dotted names. */
typedef struct ct_param_list {
    int n;
    ct_tensor **tensors; /* borrowed from the module */
    char **names;        /* owned by the list */
} ct_param_list;

/* Parameters (or, with buffers = true, parameters then buffers) in
 * registration order, depth first, each tensor once. Free with ct_param_list_free. */
CT_API ct_status ct_module_named_tensors(const ct_module *m, bool buffers, ct_param_list *out);
/* Frees the list: its names and arrays (the tensors are borrowed); NULL is fine. */
CT_API void ct_param_list_free(ct_param_list *l);
/* Total number of parameter elements (each tensor once). */
CT_API int64_t ct_module_num_params(const ct_module *m);
/* The parameter or buffer with this dotted name, or NULL. Borrowed. */
CT_API ct_tensor *ct_module_find(const ct_module *m, const char *name);
/* Releases every parameter's .grad. */
CT_API void ct_module_zero_grad(ct_module *m);
/* Moves every parameter, buffer and gradient of the tree to dev in place: the
 * tensors keep their identity (optimizers and callers keep their pointers), tied
 * weights stay tied. Nothing moves when it fails. Sharded (prepared) models are
 * refused: move a model before ct_accelerator_prepare, which does it itself. */
CT_API ct_status ct_module_to(ct_module *m, ct_device dev);

/* ---- state dicts as safetensors ------------------------------------------------ */

/* Writes parameters and buffers under their dotted names (tied tensors once)
 * with optional metadata pairs, atomically (temporary file + rename). */
CT_API ct_status ct_module_save(const ct_module *m, const char *path, int nmeta, const char *const *meta_keys,
                                const char *const *meta_values);

/* What a load found. Lists are owned by the report; free with ct_load_report_free. */
typedef struct ct_load_report {
    int nmissing, nunexpected, nmismatched;
    char **missing;    /* in the module, not in the file */
    char **unexpected; /* in the file, not in the module */
    char **mismatched; /* "name: file f32[3, 4], module f32[4, 3]" */
} ct_load_report;

/* Copies every tensor of the file (a .safetensors file, or a Hugging Face model
 * directory, single-file or sharded: nn/hf_weights.h) whose name the module has into the module's
 * tensor (dtype converted when they differ, shape must match). strict: any
 * missing, unexpected or mismatched name is an error listing them, and nothing
 * is copied. Not strict: loads what matches and reports the rest (report may be
 * NULL). */
CT_API ct_status ct_module_load(ct_module *m, const char *path, bool strict, ct_load_report *report);
/* Frees a report that ct_module_load filled in; NULL is fine. */
CT_API void ct_load_report_free(ct_load_report *r);

/* Maps the name of a tensor in the file to the module's dotted name for it: returns
 * file_name itself, a name written into buf (buflen bytes), or NULL when the module
 * has no use for that tensor (it is then neither loaded nor reported unexpected). */
typedef const char *(*ct_load_key_fn)(const char *file_name, char *buf, size_t buflen, void *ctx);
/* ct_module_load through a name map (map NULL = names as they are); how a model reads
 * a checkpoint written under another prefix or with extra buffers (see ct_gpt_load). */
CT_API ct_status ct_module_load_mapped(ct_module *m, const char *path, bool strict, ct_load_report *report,
                                       ct_load_key_fn map, void *ctx);

#endif
