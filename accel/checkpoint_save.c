/* ctrain — ct_accelerator_save_state (accel/checkpoint.h).
 *
 * The protocol. Rank 0 picks the directory and makes "<dir>.tmp-<id>" beside it.
 * Replicated (one process, DDP) rank 0 writes every file alone, no collective;
 * sharded, rank 0 first broadcasts the temporary directory's name (the collective a
 * rank-0-only call fails on), every rank writes its model and optimizer parts, the
 * ranks all-gather their files' checksums and their generators and loader cursors,
 * and rank 0 writes the rest. Every file is durable (fsync) before rank 0 writes the
 * manifest, last, and renames the directory into place; only then is an older
 * checkpoint removed (a replaced one, or one beyond total_limit).
 */
#include "accel/checkpoint_internal.h"
#include "accel/megatron_checkpoint_internal.h"
#include "accel/megatron_zero_internal.h"
#include "accel/model_shards_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/frame.h"
#include "core/philox.h"

#define BCAST_BYTES 8192

void cti_ckpt_opt_param(const ct_accelerator *a, int i, char *buf, size_t cap, const ct_tensor **full, int64_t *b,
                        int64_t *e)
{
    const ct_tensor *p = ct_optimizer_param(a->opt, i);
    if (a->shard) {
        const char *name = NULL;
        ct_shard_slice_part(a->shard, i, &name, full, b, e);
        if (name) {
            snprintf(buf, cap, "%s", name);
            return;
        }
        /* a parameter the engine leaves alone: another pipeline stage's */
    }
    *full = p, *b = 0, *e = ct_tensor_numel(p);
    for (int k = 0; k < a->params.n; k++)
        if (a->params.tensors[k] == p) {
            snprintf(buf, cap, "%s", a->params.names[k]);
            return;
        }
    /* a pipeline: a parameter of another stage (a->params holds this stage's) */
    for (int k = 0; k < a->pp_all.n; k++)
        if (a->pp_all.tensors[k] == p) {
            snprintf(buf, cap, "%s", a->pp_all.names[k]);
            return;
        }
    snprintf(buf, cap, "optimizer.param.%d", i);
}

/* ---- the optimizer's parts ------------------------------------------------------------ */

typedef struct opt_parts {
    ct_shard_part *parts;
    int n;
    char **list; /* every "<param>.<key>", optimizer order */
    int nlist;
    char **mkeys, **mvals;
    int nmeta, capmeta;
} opt_parts;

static void opt_parts_free(opt_parts *o)
{
    for (int i = 0; i < o->n; i++) free((char *)o->parts[i].name);
    for (int i = 0; i < o->nlist; i++) free(o->list[i]);
    for (int i = 0; i < o->nmeta; i++) free(o->mkeys[i]), free(o->mvals[i]);
    free(o->parts), free(o->list), free(o->mkeys), free(o->mvals);
    *o = (opt_parts){0};
}

static ct_status meta(opt_parts *o, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ct_status meta(opt_parts *o, const char *key, const char *fmt, ...)
{
    if (o->nmeta == o->capmeta) {
        int cap = o->capmeta ? 2 * o->capmeta : 64;
        char **k = realloc(o->mkeys, (size_t)cap * sizeof *k), **v = k ? realloc(o->mvals, (size_t)cap * sizeof *v) : NULL;
        if (k) o->mkeys = k;
        if (!v) return ct_error_set(CT_ERR_NOMEM, "out of memory");
        o->mvals = v, o->capmeta = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *val = NULL;
    if (vasprintf(&val, fmt, ap) < 0) val = NULL;
    va_end(ap);
    char *k = strdup(key);
    if (!k || !val) {
        free(k), free(val);
        return ct_error_set(CT_ERR_NOMEM, "out of memory");
    }
    o->mkeys[o->nmeta] = k, o->mvals[o->nmeta++] = val;
    return CT_OK;
}

/* This rank's parts of the optimizer's state (1-d values in the current frame) and the
 * metadata every optimizer file carries: kind, step count, lr, groups, hyper-parameters,
 * the parameters' names in optimizer order, each stepped parameter's step. */
static ct_status build_opt_parts(ct_accelerator *a, opt_parts *o)
{
    ct_optimizer *opt = a->opt;
    const char *keys[2];
    const int nk = ct_optimizer_state_keys(opt, keys), np = ct_optimizer_param_count(opt);
    const int ng = ct_optimizer_group_count(opt);
    o->parts = calloc((size_t)(np * nk + 1), sizeof *o->parts);
    o->list = calloc((size_t)(np * nk + 1), sizeof *o->list);
    if (!o->parts || !o->list) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    const ct_optimizer_hparams h = ct_optimizer_hparams_get(opt);
    ct_status st = meta(o, "ctrain.optimizer", "%s", ct_optimizer_name(opt));
    if (!st) st = meta(o, "ctrain.step", "%" PRId64, ct_optimizer_step_count(opt));
    if (!st) st = meta(o, "ctrain.lr", "%.17g", ct_optimizer_lr(opt));
    if (!st) st = meta(o, "ctrain.optimizer_params", "%d", np);
    if (!st) st = meta(o, "ctrain.groups", "%d", ng);
    if (!st) st = meta(o, "ctrain.hparams", "%.17g %.17g %.17g %.17g %.17g %d", h.beta1, h.beta2, h.eps, h.momentum,
                       h.dampening, (int)h.nesterov);
    for (int g = 0; g < ng && !st; g++) {
        char key[64];
        snprintf(key, sizeof key, "ctrain.group.%d", g);
        st = meta(o, key, "%.17g %.17g", ct_optimizer_group_lr_scale(opt, g), ct_optimizer_group_weight_decay(opt, g));
    }
    for (int i = 0; i < np && !st; i++) {
        char name[512], key[600];
        const ct_tensor *full = NULL;
        int64_t b, e;
        cti_ckpt_opt_param(a, i, name, sizeof name, &full, &b, &e);
        ct_tensor *p = ct_optimizer_param(opt, i);
        /* under the engine over dp (tp x ZeRO) p is a slice of the local parameter */
        const ct_tensor *lp = a->mesh && a->shard ? full : p;
        const int64_t sb = b, se = e;
        int64_t step = ct_optimizer_param_step(opt, i);
        if (a->mesh && a->shard && (step = cti_accel_megatron_zero_step(a, step)) < 0)
            return ct_error_prefix("parameter '%s': ", name);
        const bool held = cti_accel_megatron_pp_holds(a, lp);
        if (a->mesh) {
            /* tensor (and pipeline) parallelism: the whole parameter and its whole
             * moments, as one process saves them (every tp rank gathers, the stage
             * that holds it sends it on, rank 0 writes) */
            ct_tensor *w = NULL;
            if (cti_accel_megatron_gather_any(a, lp, held ? (ct_tensor *)lp : NULL, &w) || !w ||
                cti_accel_megatron_share_i64(a, lp, &step))
                return ct_error_prefix("parameter '%s': ", name);
            full = w;
            b = 0, e = ct_tensor_numel(full);
        }
        snprintf(key, sizeof key, "ctrain.oparam.%d", i);
        st = meta(o, key, "%s", name);
        if (!st && step > 0 && b < e) {
            snprintf(key, sizeof key, "ctrain.pstep.%s", name);
            st = meta(o, key, "%" PRId64, step);
        }
        for (int k = 0; k < nk && !st; k++) {
            char *tn = NULL;
            if (asprintf(&tn, "%s.%s", name, keys[k]) < 0) return ct_error_set(CT_ERR_NOMEM, "out of memory");
            o->list[o->nlist++] = tn;
            if (b == e) continue;
            ct_tensor *s = ct_optimizer_state(opt, i, keys[k]);
            if (a->mesh && a->shard && a->pp) { /* the slices over dp, then from the stage that holds it */
                ct_tensor *loc = NULL;
                if ((held && !(loc = cti_accel_megatron_zero_local(a, i, s, lp, sb, se))) ||
                    cti_accel_megatron_gather_any(a, lp, loc, &s))
                    return ct_error_prefix("optimizer state '%s': ", tn);
            } else if (a->mesh && a->shard) /* the slices over dp into the local shape first */
                s = (s = cti_accel_megatron_zero_local(a, i, s, lp, sb, se)) ? cti_accel_megatron_gather_like(a, lp, s)
                                                                              : NULL;
            else if (a->mesh && (s || a->pp) && cti_accel_megatron_gather_any(a, p, s, &s))
                return ct_error_prefix("optimizer state '%s': ", tn);
            ct_tensor *v = s ? ct_tensor_view(ct_tensor_contiguous(s), 1, (const int64_t[]){e - b})
                             : ct_tensor_zeros(p->dtype, 1, (const int64_t[]){e - b});
            char *pn = strdup(tn);
            if (!v || !pn) {
                free(pn);
                return ct_error_prefix("optimizer state '%s': ", tn);
            }
            o->parts[o->n++] = (ct_shard_part){pn, full, v->dtype, b, e, v};
        }
    }
    return st;
}

/* pre: the parts already built (tensor parallelism: gathered on every tp rank before
 * rank 0 writes), else built here */
static ct_status write_opt_file(ct_accelerator *a, const char *dir, int file, int nfiles, uint64_t id,
                                cti_ckpt_file *f, const opt_parts *pre)
{
    opt_parts o = {0};
    ct_status st = CT_OK;
    *f = (cti_ckpt_file){0};
    cti_ckpt_rank_file_name(f->name, sizeof f->name, CT_CKPT_OPT_PREFIX, file, nfiles);
    ct_frame_push();
    if (pre) o = *pre;
    else st = build_opt_parts(a, &o);
    for (int i = 0; i < o.n && !st; i++) cti_ckpt_note_dtype(f, o.parts[i].values->dtype);
    f->tensors = o.n;
    if (!st)
        st = cti_ckpt_write_parts(dir, &(cti_ckpt_parts_file){.prefix = CT_CKPT_OPT_PREFIX,
                                                              .format = CT_CKPT_OPT_FORMAT,
                                                              .file = file,
                                                              .nfiles = nfiles,
                                                              .id = id,
                                                              .parts = o.parts,
                                                              .nparts = o.n,
                                                              .list = (const char *const *)o.list,
                                                              .nlist = o.nlist,
                                                              .meta_keys = (const char *const *)o.mkeys,
                                                              .meta_vals = (const char *const *)o.mvals,
                                                              .nmeta = o.nmeta,
                                                              .xxh3 = &f->xxh3,
                                                              .bytes = &f->bytes});
    ct_frame_pop();
    if (!pre) opt_parts_free(&o);
    return st ? ct_error_prefix("optimizer state: ") : CT_OK;
}

/* ---- rank 0's files ------------------------------------------------------------------------ */

static const char *strategy_name(const ct_accelerator *a)
{
    if (a->mesh) return "MEGATRON_LM";
    return a->shard ? ct_shard_strategy_name(ct_shard_stats_get(a->shard).strategy) : "NO_SHARD";
}

static cti_rank_state my_rank_state(const ct_accelerator *a)
{
    const ct_rng *r = ct_rng_default();
    return (cti_rank_state){r->seed, r->offset, a->loader ? ct_loader_epoch(a->loader) : 0,
                            a->loader ? ct_loader_position(a->loader) : 0};
}

/* trainer_state.json, fp8_state.safetensors and custom_<name>.safetensors, described
 * into files[*n...]. */
static ct_status write_rank0_files(const ct_accelerator *a, const char *dir, const cti_rank_state *ranks, int nranks,
                                   bool lockstep, ct_tensor *const *fp8, cti_ckpt_file *files, int *n)
{
    cti_trainer_state ts = {
        .step = a->opt ? ct_optimizer_step_count(a->opt) : 0,
        .has_sched = a->sched != NULL,
        .sched_position = a->sched ? ct_scheduler_position(a->sched) : 0,
        .accumulation_steps = a->K,
        .micro = a->micro,
        .has_scaler = a->scaling,
        .scale = a->scaler.scale,
        .good_steps = a->scaler.good_steps,
        .overflows = a->scaler.overflows,
        .scaler_steps = a->scaler.steps,
        .scaler_skipped = a->scaler.skipped,
        .has_loader = a->loader != NULL,
        .batch_size = ct_loader_batch_size(a->loader),
        .loader_world = a->mesh ? a->mesh->dp : ct_pg_size(a->pg), /* under tp the loader splits over dp */
        .num_batches = a->loader ? ct_loader_num_batches(a->loader) : 0,
        .shuffle = ct_loader_shuffles(a->loader),
        .loader_seed = ct_loader_seed(a->loader),
        .lockstep = lockstep,
        .seeded = a->seeded,
        .seed_per_rank = a->seed_per_rank,
        .seed_base = a->seed_base,
        .nranks = nranks,
        .ranks = (cti_rank_state *)ranks,
        .has_fp8 = a->fp8 != NULL,
        .fp8_history = a->fp8 ? ct_fp8_state_recipe(a->fp8)->amax_history_len : 0,
        .fp8_slots = fp8 && fp8[0] ? fp8[0]->shape[0] : ct_fp8_state_weights(a->fp8),
        .ncustom = a->nobjects,
    };
    ts.custom = calloc((size_t)a->nobjects + 1, sizeof *ts.custom);
    if (!ts.custom) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < a->nobjects; i++) snprintf(ts.custom[i], sizeof ts.custom[i], "%s", a->objects[i].name);
    ct_status st = cti_ckpt_write_trainer_state(dir, &ts);
    free(ts.custom);
    if (!st) st = cti_ckpt_describe_file(dir, CT_CKPT_STATE, &files[(*n)++]);
    if (!st) cti_ckpt_fault_point();
    if (!st && a->fp8) CT_FRAME {
            ct_tensor *t[4];
            static const char *const names[4] = {"scale", "pending", "history", "counters"};
            if (fp8 && fp8[0]) memcpy(t, fp8, sizeof t); /* gathered by the caller (every stage's) */
            else st = ct_fp8_state_export(a->fp8, t);
            if (!st) st = cti_ckpt_save_tensors(dir, CT_CKPT_FP8, 4, names, t, &files[(*n)++]);
            if (!st) cti_ckpt_fault_point();
        }
    for (int i = 0; i < a->nobjects && !st; i++) {
        ct_state_dict sd = {0};
        char name[CT_CKPT_NAME_MAX];
        snprintf(name, sizeof name, "custom_%s.safetensors", a->objects[i].name);
        st = a->objects[i].state_dict(a->objects[i].obj, &sd);
        if (st) st = ct_error_prefix("registered object '%s': state_dict: ", a->objects[i].name);
        else st = cti_ckpt_save_tensors(dir, name, sd.n, (const char *const *)sd.names, sd.tensors, &files[(*n)++]);
        ct_state_dict_free(&sd);
        if (!st) cti_ckpt_fault_point();
    }
    return st;
}

/* Rank 0's end of a save: the manifest, last, then the directory into place. */
static ct_status finish(ct_accelerator *a, const char *tmp, const char *final, const cti_ckpt_file *files, int n)
{
    const bool sharded_model = a->shard != NULL;
    ct_status st = cti_ckpt_write_manifest(tmp, &(cti_ckpt_manifest){
                                                   .step = a->opt ? ct_optimizer_step_count(a->opt) : 0,
                                                   .world_size = ct_pg_size(a->pg),
                                                   .shard_world = a->shard ? ct_shard_stats_get(a->shard).shard_world : 1,
                                                   .strategy = strategy_name(a),
                                                   .mixed_precision = ct_accelerator_mixed_precision(a),
                                                   .optimizer = a->opt ? ct_optimizer_name(a->opt) : "",
                                                   .sharded_model = sharded_model,
                                                   .tp = a->mesh ? a->mesh->tp : 1,
                                                   .dp = a->mesh ? a->mesh->dp : ct_pg_size(a->pg),
                                                   .pp = a->mesh ? a->mesh->pp : 1,
                                                   .files = files,
                                                   .nfiles = n});
    if (st) return st;
    cti_ckpt_fault_point();
    /* an existing directory is moved aside first and removed once the new one is in place */
    char old[4200] = "";
    struct stat sb;
    if (!lstat(final, &sb)) {
        snprintf(old, sizeof old, "%s.old-%ld", final, (long)getpid());
        if (rename(final, old))
            return ct_error_set(CT_ERR_IO, "cannot move the existing '%s' aside: %s", final, strerror(errno));
    }
    if (rename(tmp, final)) {
        st = ct_error_set(CT_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
        if (old[0]) rename(old, final);
        return st;
    }
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", final);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = slash == parent ? (slash[1] = '\0', '/') : '\0';
    else snprintf(parent, sizeof parent, ".");
    st = cti_dir_sync(parent);
    cti_ckpt_fault_point();
    if (!st && old[0]) st = cti_ckpt_remove_tree(old);
    return st;
}

/* ---- the call ------------------------------------------------------------------------------- */

/* Where this save goes: final (malloc'd) and its temporary directory beside it. */
static ct_status target(ct_accelerator *a, const char *dir, char **final, char **tmp, bool *automatic)
{
    *automatic = dir == NULL;
    char *root = NULL;
    if (!dir) {
        if (!a->cfg.project.automatic_checkpoint_naming)
            return ct_error_set(CT_ERR_INVALID,
                                "dir is NULL but the project config has no automatic_checkpoint_naming: pass a "
                                "directory, or set project.automatic_checkpoint_naming (and project_dir)");
        if (!(root = cti_ckpt_auto_root(a->project_dir))) return ct_last_status();
        ct_status st = cti_ckpt_mkdirs(root);
        if (st) {
            free(root);
            return st;
        }
        if (a->iteration < 0) a->iteration = cti_ckpt_auto_highest(root) + 1;
        if (asprintf(final, "%s/checkpoint_%" PRId64, root, a->iteration) < 0) *final = NULL;
        free(root);
    } else {
        *final = strdup(dir);
    }
    if (!*final) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    size_t len = strlen(*final);
    while (len > 1 && (*final)[len - 1] == '/') (*final)[--len] = '\0';
    static unsigned counter;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (asprintf(tmp, "%s.tmp-%lx-%lx-%x", *final, (long)getpid(), (long)now.tv_nsec, counter++) < 0) *tmp = NULL;
    if (!*tmp) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    /* the parent must exist (an explicit dir's parents are made, as Accelerate's makedirs) */
    char *parent = strdup(*final), *slash = parent ? strrchr(parent, '/') : NULL;
    ct_status st = parent ? CT_OK : ct_error_set(CT_ERR_NOMEM, "out of memory");
    if (slash && slash != parent) {
        *slash = '\0';
        st = cti_ckpt_mkdirs(parent);
    }
    free(parent);
    if (!st && mkdir(*tmp, 0755))
        st = ct_error_set(CT_ERR_IO, "cannot create '%s': %s", *tmp, strerror(errno));
    return st;
}

/* What a Megatron-LM save gathers besides the model and the optimizer state. */
typedef struct tp_extras {
    ct_tensor *rng[3];       /* the GPT's dropout generators (seed, offset, layout), or NULL */
    cti_rank_state *ranks;   /* a pipeline: every rank's process generator (NULL: rank 0's, in lockstep) */
    int nranks;
    ct_tensor *fp8[4];       /* a pipeline: every stage's fp8 metas in stage order (NULL: this rank's) */
} tp_extras;

/* Replicated: rank 0 writes everything. Under tensor parallelism the whole model
 * (model, already gathered), the whole optimizer state (opt) and the extras (x; NULL
 * none) come from the caller. */
static ct_status save_replicated(ct_accelerator *a, const char *tmp, const char *final, const ct_param_list *model,
                                 const opt_parts *opt, const tp_extras *x)
{
    ct_tensor *const *tp_rng = x ? x->rng : NULL;
    cti_ckpt_file files[8 + 64];
    int n = 0;
    if (a->nobjects > 64) return ct_error_set(CT_ERR_UNSUPPORTED, "more than 64 registered objects");
    ct_status st = CT_OK;
    if (a->model) {
        /* ct_module_save's file (HF names, buffers too), checksummed as it is written */
        ct_param_list l = {0};
        if (!model) st = ct_module_named_tensors(a->model, true, &l);
        const ct_param_list *w = model ? model : &l;
        if (!st) st = cti_ckpt_save_tensors(tmp, CT_CKPT_MODEL, w->n, (const char *const *)w->names, w->tensors, &files[n++]);
        ct_param_list_free(&l);
        if (!st) cti_ckpt_fault_point();
    }
    if (!st && a->opt) {
        st = write_opt_file(a, tmp, 0, 1, 0, &files[n++], opt);
        if (!st) cti_ckpt_fault_point();
    }
    if (!st && tp_rng && tp_rng[0]) {
        static const char *const names[3] = {"seed", "offset", "layout"};
        st = cti_ckpt_save_tensors(tmp, CT_CKPT_TP_RNG, 3, names, tp_rng, &files[n++]);
        if (!st) cti_ckpt_fault_point();
    }
    const cti_rank_state me = my_rank_state(a);
    if (!st)
        st = x && x->ranks ? write_rank0_files(a, tmp, x->ranks, x->nranks, false, x->fp8, files, &n)
                           : write_rank0_files(a, tmp, &me, 1, true, x ? x->fp8 : NULL, files, &n);
    if (!st) st = finish(a, tmp, final, files, n);
    return st;
}

/* What each rank tells rank 0 about its part of a sharded save. */
typedef struct rank_report {
    cti_rank_state state;
    int32_t nfiles;
    cti_ckpt_file files[2];
} rank_report;

static ct_status save_sharded(ct_accelerator *a, const char *tmp, const char *final)
{
    const int rank = ct_pg_rank(a->pg), world = ct_pg_size(a->pg);
    const bool writer = ct_shard_writes_parts(a->shard);
    const int S = ct_shard_stats_get(a->shard).shard_world;
    uint64_t h = 0;
    int64_t bytes = 0;
    ct_status st = cti_model_shards_save_hashed(a, a->model, tmp, &h, &bytes);
    rank_report mine = {.state = my_rank_state(a)};
    if (!st && writer) {
        char name[CT_CKPT_NAME_MAX];
        cti_ckpt_rank_file_name(name, sizeof name, "model", rank, S);
        st = cti_ckpt_describe_written(tmp, name, h, bytes, &mine.files[mine.nfiles++]);
        if (!st && a->opt) st = write_opt_file(a, tmp, rank, S, 0, &mine.files[mine.nfiles++], NULL);
        if (!st) cti_ckpt_fault_point();
    }
    st = cti_ckpt_agree(a, st);
    if (st) return st;
    rank_report *all = calloc((size_t)world, sizeof *all);
    cti_rank_state *states = calloc((size_t)world, sizeof *states);
    cti_ckpt_file *files = calloc((size_t)(2 * world + 8 + a->nobjects), sizeof *files);
    if (!all || !states || !files) st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    CT_FRAME {
        ct_tensor *in = st ? NULL : ct_tensor_from_data(CT_DTYPE_U8, CT_SHAPE((int64_t)sizeof mine), &mine);
        ct_tensor *out = in ? ct_tensor_empty(CT_DTYPE_U8, CT_SHAPE((int64_t)(sizeof mine * (size_t)world))) : NULL;
        if (!st) st = out ? ct_work_run(ct_pg_allgather(a->pg, out, in)) : ct_last_status();
        if (!st) memcpy(all, ct_tensor_data(out), sizeof mine * (size_t)world);
    }
    int n = 0;
    for (int r = 0; r < world && !st; r++) {
        states[r] = all[r].state;
        for (int k = 0; k < all[r].nfiles && k < 2; k++) files[n++] = all[r].files[k];
    }
    if (!st && rank == 0) st = write_rank0_files(a, tmp, states, world, false, NULL, files, &n);
    if (!st && rank == 0) st = finish(a, tmp, final, files, n);
    free(all), free(states), free(files);
    return cti_ckpt_agree(a, st);
}

/* Every rank's process generator and loader position on every rank (an all-gather over
 * the world); *out owned by the caller. */
static ct_status gather_rank_states(ct_accelerator *a, cti_rank_state **out, int *n)
{
    const int world = ct_pg_size(a->pg);
    const cti_rank_state me = my_rank_state(a);
    int64_t v[4] = {(int64_t)me.rng_seed, (int64_t)me.rng_offset, me.epoch, me.position};
    ct_status st = CT_OK;
    *out = calloc((size_t)world, sizeof **out);
    if (!*out) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    *n = world;
    CT_FRAME {
        ct_tensor *in = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1, 4), v);
        ct_tensor *all = in ? ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(world, 4)) : NULL;
        st = all ? ct_work_run(ct_pg_allgather(a->pg, all, in)) : ct_last_status();
        const int64_t *p = st ? NULL : ct_tensor_data(all);
        for (int r = 0; p && r < world; r++)
            (*out)[r] = (cti_rank_state){(uint64_t)p[4 * r], (uint64_t)p[4 * r + 1], p[4 * r + 2], p[4 * r + 3]};
    }
    return st ? ct_error_prefix("gathering the ranks' generators: ") : CT_OK;
}

/* Tensor parallelism: every rank's dropout generator is gathered (a collective over
 * the world), the tp ranks of data-parallel index 0 gather the whole model and
 * optimizer state (collectives over their tp group), then rank 0 writes it as one
 * process would; every rank joins the agreement at the end. A rank that failed still
 * joins the tp collectives, so that none waits for it. Under the sharding engine over dp
 * every rank first gathers its local parameters and moments over dp (every tp group
 * then gathers over tp alike; only rank 0's copy is written). */
static ct_status save_tp(ct_accelerator *a, const char *dir, char **final, char **tmp, bool *automatic)
{
    const int rank = ct_pg_rank(a->pg);
    ct_param_list l = {0};
    opt_parts o = {0};
    tp_extras x = {0};
    ct_frame_push();
    ct_status st = cti_accel_megatron_rng_gather(a, x.rng);
    /* a pipeline: the stages draw from their own process generators (not in lockstep),
     * and each stage's fp8 state holds its own layers' rows */
    if (!st && a->pp) st = gather_rank_states(a, &x.ranks, &x.nranks);
    if (!st && a->pp && a->fp8) st = cti_accel_megatron_fp8_export(a, x.fp8);
    if (a->mesh->dp_rank == 0 || a->shard) {
        ct_status s = a->shard ? ct_shard_gather_full(a->shard) : CT_OK;
        if (!s && a->model) s = cti_accel_megatron_model_tensors(a, &l);
        if (!s && a->opt) s = build_opt_parts(a, &o);
        ct_shard_release_full(a->shard);
        if (s) ct_error_prefix("tensor parallelism (tp %d x dp %d): ", a->mesh->tp, a->mesh->dp);
        if (!st) st = s;
    }
    if (!st && rank == 0) {
        st = target(a, dir, final, tmp, automatic);
        if (!st) st = save_replicated(a, *tmp, *final, a->model ? &l : NULL, a->opt ? &o : NULL, &x);
        if (st && *tmp) cti_ckpt_remove_tree(*tmp);
    }
    ct_frame_pop();
    free(x.ranks);
    ct_param_list_free(&l);
    opt_parts_free(&o);
    return cti_ckpt_agree(a, st);
}

ct_status ct_accelerator_save_state(ct_accelerator *acc, const char *dir)
{
    if (!acc) return ct_error_set(CT_ERR_INVALID, "accelerator_save_state: accelerator is NULL");
    const int rank = ct_pg_rank(acc->pg), world = ct_pg_size(acc->pg);
    ct_status st = CT_OK;
    if (!acc->prepared) st = ct_error_set(CT_ERR_INVALID, "call ct_accelerator_prepare first");
    else if (acc->micro != 0)
        st = ct_error_set(CT_ERR_INVALID,
                          "in the middle of a gradient-accumulation window (micro-step %" PRId64 " of %d): the "
                          "accumulated gradients are not part of a checkpoint; save after the optimizer step, when "
                          "ct_accelerator_sync_gradients is true",
                          acc->micro, acc->K);
    if (st) return ct_error_prefix("accelerator_save_state (rank %d of %d): ", rank, world);
    char *final = NULL, *tmp = NULL;
    bool automatic = false;
    if (acc->mesh) {
        st = save_tp(acc, dir, &final, &tmp, &automatic);
        if (!st && rank != 0) automatic = dir == NULL;
    } else if (!acc->shard) {
        /* replicated: rank 0 holds everything; the others have nothing to write */
        if (rank == 0) {
            st = target(acc, dir, &final, &tmp, &automatic);
            if (!st) st = save_replicated(acc, tmp, final, NULL, NULL, NULL);
            if (st && tmp) cti_ckpt_remove_tree(tmp);
        } else if (acc->iteration >= 0) {
            acc->iteration++;
        }
    } else {
        /* rank 0 names the directory; the broadcast is the collective a rank-0-only call
         * fails on (the others' next collective reports the desync) */
        char msg[BCAST_BYTES] = {0};
        if (rank == 0) {
            ct_status t = target(acc, dir, &final, &tmp, &automatic);
            if (t) snprintf(msg, sizeof msg, "!%s", ct_last_error());
            else if (snprintf(msg, sizeof msg, "%" PRId64 "\n%s\n%s", acc->iteration, final, tmp) >= (int)sizeof msg)
                snprintf(msg, sizeof msg, "!checkpoint path '%.100s...' is too long", final);
        }
        CT_FRAME {
            /* an all-reduce first: unlike a broadcast, its root cannot finish it alone */
            ct_tensor *j = ct_tensor_from_data(CT_DTYPE_I32, CT_SHAPE(1), (int32_t[]){1});
            st = j ? ct_work_run(ct_pg_allreduce(acc->pg, j, CT_REDUCE_MIN)) : ct_last_status();
            ct_tensor *b = st ? NULL : ct_tensor_from_data(CT_DTYPE_U8, CT_SHAPE(BCAST_BYTES), msg);
            if (!st) st = b ? ct_work_run(ct_pg_broadcast(acc->pg, b, 0)) : ct_last_status();
            if (!st) memcpy(msg, ct_tensor_data(b), sizeof msg);
        }
        if (st) {
            ct_error_prefix("the ranks did not all join the save (%s strategy: the state is sharded, so every rank "
                            "must call ct_accelerator_save_state, not only the main process; call it outside "
                            "`if (is_main_process)`): ",
                            strategy_name(acc));
        } else if (msg[0] == '!') {
            st = rank == 0 ? ct_last_status() : ct_error_set(CT_ERR_PEER, "rank 0 failed: %s", msg + 1);
        } else if (rank != 0) {
            char *nl1 = strchr(msg, '\n'), *nl2 = nl1 ? strchr(nl1 + 1, '\n') : NULL;
            if (!nl2) st = ct_error_set(CT_ERR_INTERNAL, "garbled directory names from rank 0");
            else {
                *nl1 = *nl2 = '\0';
                acc->iteration = strtoll(msg, NULL, 10);
                automatic = dir == NULL;
                final = strdup(nl1 + 1), tmp = strdup(nl2 + 1);
                if (!final || !tmp) st = ct_error_set(CT_ERR_NOMEM, "out of memory");
            }
        }
        if (!st) st = save_sharded(acc, tmp, final);
        if (st && rank == 0 && tmp) cti_ckpt_remove_tree(tmp);
    }
    if (!st && (rank == 0 || acc->shard || acc->mesh)) {
        if (automatic && (!acc->mesh || rank == 0 || acc->iteration >= 0)) acc->iteration++;
        if (rank == 0 && automatic && acc->cfg.project.total_limit > 0) {
            char *root = cti_ckpt_auto_root(acc->project_dir);
            st = root ? cti_ckpt_apply_total_limit(root, acc->cfg.project.total_limit) : ct_last_status();
            free(root);
        }
        if (!st) {
            free(acc->last_checkpoint);
            acc->last_checkpoint = final;
            final = NULL;
        }
    }
    free(final), free(tmp);
    return st ? ct_error_prefix("accelerator_save_state (rank %d of %d): ", rank, world) : CT_OK;
}
