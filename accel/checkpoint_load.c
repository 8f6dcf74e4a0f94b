/* ctrain — ct_accelerator_load_state (accel/checkpoint.h).
 *
 * Three phases, so that a failed load changes nothing: every rank verifies its share
 * of the files' checksums and stages what it will restore (the optimizer's state for
 * the elements its slices hold, the fp8 metas, the registered objects' dicts, the
 * loader cursor and generator it resumes at), the ranks agree, and only then is
 * anything written: the registered objects, the model (ct_accelerator_load_model:
 * any world size and strategy), the optimizer, and the scalars.
 */
#include "accel/checkpoint_internal.h"
#include "accel/megatron_checkpoint_internal.h"
#include "accel/model_shards_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/frame.h"
#include "core/philox.h"
#include "autograd/autocast_cast.h"

/* Everything a load restores, read and checked before anything changes. */
typedef struct staged {
    cti_trainer_state ts;
    ct_checkpoint_info info;
    /* the optimizer */
    bool has_opt;
    ct_optimizer_restore_spec spec;
    double *lr_scale, *weight_decay;
    int64_t *param_step;
    ct_tensor **state[2]; /* retained */
    int np;
    /* fp8 */
    ct_tensor *fp8[4]; /* retained */
    /* registered objects, in registration order */
    ct_state_dict *dicts;
    int ndicts;
    /* loader and generator; the GPT's tensor-parallel dropout generator */
    int64_t epoch, position;
    ct_rng rng, tp_rng;
    bool has_tp_rng;
} staged;

static void staged_free(staged *s)
{
    cti_trainer_state_free(&s->ts);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; s->state[k] && i < s->np; i++) ct_tensor_release(s->state[k][i]);
        free(s->state[k]);
    }
    for (int t = 0; t < 4; t++) ct_tensor_release(s->fp8[t]);
    for (int i = 0; i < s->ndicts; i++) ct_state_dict_free(&s->dicts[i]);
    free(s->dicts), free(s->lr_scale), free(s->weight_decay), free(s->param_step);
}

static ct_status parse_f64s(const char *path, const char *key, const char *v, int n, double *out)
{
    const char *p = v;
    for (int i = 0; i < n; i++) {
        char *end = NULL;
        out[i] = p ? strtod(p, &end) : 0;
        if (!p || end == p) return ct_error_set(CT_ERR_FORMAT, "%s: %s is '%s', expected %d numbers", path, key, v ? v : "(none)", n);
        p = end;
    }
    return CT_OK;
}

/* ---- the optimizer ----------------------------------------------------------------------- */

static const char *meta0(const ct_ckpt *ck, const char *key)
{
    return ct_safetensors_metadata(ck->files[0], key);
}

/* The parameter's steps: the largest any file records (a rank whose slice missed it
 * never stepped it). */
static int64_t param_steps(const ct_ckpt *ck, const char *name)
{
    char key[600];
    snprintf(key, sizeof key, "ctrain.pstep.%s", name);
    int64_t best = 0;
    for (int f = 0; f < ck->nfiles; f++) {
        const char *v = ct_safetensors_metadata(ck->files[f], key);
        const int64_t s = v ? strtoll(v, NULL, 10) : 0;
        if (s > best) best = s;
    }
    return best;
}

static ct_status stage_optimizer(const ct_accelerator *a, const char *dir, staged *s)
{
    ct_optimizer *opt = a->opt;
    const int np = ct_optimizer_param_count(opt), ng = ct_optimizer_group_count(opt);
    const char *keys[2];
    const int nk = ct_optimizer_state_keys(opt, keys);
    ct_ckpt ck;
    ct_status st = cti_ckpt_open_parts(dir, CT_CKPT_OPT_PREFIX, CT_CKPT_OPT_FORMAT, &ck);
    const char *path = ck.nfiles ? ck.paths[0] : dir;
    const char *kind = st ? NULL : meta0(&ck, "ctrain.optimizer");
    if (!st && (!kind || strcmp(kind, ct_optimizer_name(opt))))
        st = ct_error_set(CT_ERR_INVALID, "%s: the checkpoint's optimizer is %s, this run's is %s", path,
                          kind ? kind : "(none)", ct_optimizer_name(opt));
    const char *v;
    if (!st && (!(v = meta0(&ck, "ctrain.optimizer_params")) || atoi(v) != np))
        st = ct_error_set(CT_ERR_INVALID, "%s: the checkpoint's optimizer has %s parameters, this run's has %d", path,
                          v ? v : "(no count of)", np);
    if (!st && (!(v = meta0(&ck, "ctrain.groups")) || atoi(v) != ng))
        st = ct_error_set(CT_ERR_INVALID, "%s: the checkpoint's optimizer has %s parameter groups, this run's has %d",
                          path, v ? v : "(no count of)", ng);
    s->np = np;
    s->lr_scale = calloc((size_t)ng + 1, sizeof(double));
    s->weight_decay = calloc((size_t)ng + 1, sizeof(double));
    s->param_step = calloc((size_t)np + 1, sizeof(int64_t));
    for (int k = 0; k < 2; k++) s->state[k] = calloc((size_t)np + 1, sizeof(ct_tensor *));
    if (!st && (!s->lr_scale || !s->weight_decay || !s->param_step || !s->state[0] || !s->state[1]))
        st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    double hp[6] = {0}, lr = 0;
    if (!st) st = parse_f64s(path, "ctrain.hparams", meta0(&ck, "ctrain.hparams"), 6, hp);
    if (!st) st = parse_f64s(path, "ctrain.lr", meta0(&ck, "ctrain.lr"), 1, &lr);
    for (int g = 0; g < ng && !st; g++) {
        char key[64];
        double two[2] = {0, 0};
        snprintf(key, sizeof key, "ctrain.group.%d", g);
        st = parse_f64s(path, key, meta0(&ck, key), 2, two);
        s->lr_scale[g] = two[0], s->weight_decay[g] = two[1];
    }
    const char *step = st ? NULL : meta0(&ck, "ctrain.step");
    for (int i = 0; i < np && !st; i++) {
        char name[512], key[64], tn[600];
        const ct_tensor *full = NULL;
        int64_t b = 0, e = 0;
        cti_ckpt_opt_param(a, i, name, sizeof name, &full, &b, &e);
        snprintf(key, sizeof key, "ctrain.oparam.%d", i);
        const char *saved = meta0(&ck, key);
        if (!saved || strcmp(saved, name)) {
            st = ct_error_set(CT_ERR_INVALID,
                              "%s: optimizer parameter %d is '%s' in the checkpoint but '%s' in this run: another "
                              "model or optimizer",
                              path, i, saved ? saved : "(none)", name);
            break;
        }
        const ct_tensor *p = ct_optimizer_param(opt, i);
        /* a parameter of another pipeline stage: that stage's optimizer steps it */
        s->param_step[i] = cti_accel_megatron_pp_holds(a, p) ? param_steps(&ck, name) : 0;
        /* under the engine over dp (tp x ZeRO) p is elements [b, e) of the local parameter */
        const ct_tensor *lp = a->mesh && a->shard ? full : p;
        /* the whole parameter's shape: under tensor parallelism lp is this rank's shard */
        int fnd = full->ndim;
        int64_t fshape[CT_MAX_DIMS];
        memcpy(fshape, full->shape, (size_t)fnd * sizeof *fshape);
        if (a->mesh) cti_accel_megatron_full_shape(a, lp, &fnd, fshape);
        for (int k = 0; k < nk && !st && s->param_step[i] > 0; k++) {
            snprintf(tn, sizeof tn, "%s.%s", name, keys[k]);
            const ct_ckpt_entry *x = cti_ckpt_find(&ck, tn);
            char sa[96], sb[96];
            if (!x) {
                st = ct_error_set(CT_ERR_INVALID, "%s: no '%s' in the checkpoint", dir, tn);
            } else if (x->ndim != fnd || memcmp(x->shape, fshape, (size_t)fnd * sizeof *x->shape)) {
                st = ct_error_set(CT_ERR_INVALID, "%s: '%s' is %s in the checkpoint but the parameter is %s", dir, tn,
                                  ct_shape_str(x->ndim, x->shape, sa, sizeof sa), ct_shape_str(fnd, fshape, sb, sizeof sb));
            } else if (a->mesh) {
                /* the whole moment, then this rank's slice of it (the model's sharding) */
                ct_frame_push();
                ct_tensor *w = ct_tensor_empty(p->dtype, fnd, fshape);
                ct_tensor *flat = w ? ct_tensor_view(w, 1, (const int64_t[]){ct_tensor_numel(w)}) : NULL;
                ct_tensor *mine = NULL;
                if (!flat || cti_ckpt_read(&ck, x, 0, ct_tensor_numel(w), flat) ||
                    !(mine = cti_accel_megatron_slice_like(a, lp, w)))
                    st = ct_error_prefix("%s: ", tn);
                else if (lp != p && !(mine = ct_tensor_contiguous(ct_tensor_narrow(
                                          ct_tensor_view(mine, 1, (const int64_t[]){ct_tensor_numel(mine)}), 0, b, e - b))))
                    st = ct_error_prefix("%s: ", tn);
                else s->state[k][i] = ct_tensor_retain(mine);
                ct_frame_pop();
            } else {
                ct_frame_push();
                ct_tensor *t = ct_tensor_empty(p->dtype, p->ndim, p->shape);
                ct_tensor *flat = t ? ct_tensor_view(t, 1, (const int64_t[]){e - b}) : NULL;
                if (!flat || cti_ckpt_read(&ck, x, b, e, flat)) st = ct_error_prefix("%s: ", tn);
                else s->state[k][i] = ct_tensor_retain(t);
                ct_frame_pop();
            }
        }
    }
    if (!st) {
        s->spec = (ct_optimizer_restore_spec){
            .step = step ? strtoll(step, NULL, 10) : 0,
            .lr = lr,
            .hparams = {hp[0], hp[1], hp[2], hp[3], hp[4], hp[5] != 0},
            .lr_scale = s->lr_scale,
            .weight_decay = s->weight_decay,
            .param_step = s->param_step,
            .state = {s->state[0], s->state[1]},
            .adopt = true, /* staged for the optimizer alone: no second copy */
        };
        s->has_opt = true;
    }
    cti_ckpt_close(&ck);
    return st ? ct_error_prefix("optimizer state: ") : CT_OK;
}

/* ---- the rest ------------------------------------------------------------------------------ */

static void note(const ct_accelerator *a, const char *dir, const char *what);

static ct_status stage_fp8(const ct_accelerator *a, const char *dir, staged *s)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, CT_CKPT_FP8);
    ct_safetensors *f = ct_safetensors_open(path);
    if (!f) return ct_last_status();
    static const char *const names[4] = {"scale", "pending", "history", "counters"};
    ct_status st = CT_OK;
    ct_frame_push();
    for (int t = 0; t < 4 && !st; t++) {
        ct_tensor *x = ct_tensor_clone(ct_safetensors_get(f, names[t]));
        if (!x) st = ct_error_prefix("%s: ", path);
        else s->fp8[t] = ct_tensor_retain(x);
    }
    ct_frame_pop();
    ct_safetensors_close(f);
    /* a pipeline: this stage's rows of the whole model's (accel/megatron_pp_fp8.c) */
    int64_t begin = 0, count = 0;
    const char *why = NULL;
    if (!st && a->pp && s->fp8[0]->ndim >= 1 &&
        !(st = cti_accel_megatron_fp8_rows(a, s->fp8[0]->shape[0], &begin, &count, &why))) {
        for (int t = 0; t < 4 && !why && !st; t++) CT_FRAME {
                ct_tensor *x = ct_tensor_clone(ct_tensor_narrow(s->fp8[t], 0, begin, count));
                if (!x) st = ct_error_prefix("%s: ", path);
                else ct_tensor_release(s->fp8[t]), s->fp8[t] = ct_tensor_retain(x);
            }
        if (why) {
            note(a, dir, why);
            for (int t = 0; t < 4; t++) ct_tensor_release(s->fp8[t]), s->fp8[t] = NULL;
        }
    }
    if (!st && s->ts.fp8_history != ct_fp8_state_recipe(a->fp8)->amax_history_len)
        st = ct_error_set(CT_ERR_INVALID, "%s: amax history of %" PRId64 " steps, this run's recipe keeps %d", path,
                          s->ts.fp8_history, ct_fp8_state_recipe(a->fp8)->amax_history_len);
    return st;
}

static ct_status stage_objects(const ct_accelerator *a, const char *dir, staged *s)
{
    for (int i = 0; i < s->ts.ncustom; i++) {
        bool found = false;
        for (int k = 0; k < a->nobjects && !found; k++) found = !strcmp(a->objects[k].name, s->ts.custom[i]);
        if (!found)
            return ct_error_set(CT_ERR_INVALID,
                                "checkpoint '%s' holds registered object '%s', which this run did not register "
                                "(ct_accelerator_register_for_checkpointing)",
                                dir, s->ts.custom[i]);
    }
    s->dicts = calloc((size_t)a->nobjects + 1, sizeof *s->dicts);
    if (!s->dicts) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    for (int k = 0; k < a->nobjects; k++) {
        bool found = false;
        for (int i = 0; i < s->ts.ncustom && !found; i++) found = !strcmp(a->objects[k].name, s->ts.custom[i]);
        if (!found)
            return ct_error_set(CT_ERR_INVALID, "checkpoint '%s' has no registered object '%s' (it holds %d others)",
                                dir, a->objects[k].name, s->ts.ncustom);
        char path[4200];
        snprintf(path, sizeof path, "%s/custom_%s.safetensors", dir, a->objects[k].name);
        ct_safetensors *f = ct_safetensors_open(path);
        if (!f) return ct_last_status();
        ct_state_dict *d = &s->dicts[s->ndicts++];
        const int n = ct_safetensors_count(f);
        d->names = calloc((size_t)n + 1, sizeof *d->names);
        d->tensors = calloc((size_t)n + 1, sizeof *d->tensors);
        ct_status st = d->names && d->tensors ? CT_OK : ct_error_set(CT_ERR_NOMEM, "out of memory");
        ct_frame_push();
        for (int t = 0; t < n && !st; t++) {
            ct_tensor *x = ct_tensor_clone(ct_safetensors_get(f, ct_safetensors_name(f, t)));
            if (!x || !(d->names[t] = strdup(ct_safetensors_name(f, t)))) st = ct_error_prefix("%s: ", path);
            else d->tensors[t] = ct_tensor_retain(x), d->n = t + 1;
        }
        ct_frame_pop();
        ct_safetensors_close(f);
        if (st) return st;
    }
    return CT_OK;
}

/* The loader's cursor at this world size: the same sample of the same epoch, which
 * needs the global batch to divide the samples consumed so far. */
static ct_status stage_loader(const ct_accelerator *a, staged *s)
{
    const cti_trainer_state *ts = &s->ts;
    const cti_rank_state *r0 = &ts->ranks[0];
    if (!ts->has_loader)
        return ct_error_set(CT_ERR_INVALID, "the checkpoint has no data loader's cursor, but this run prepared a loader");
    if (ts->shuffle != ct_loader_shuffles(a->loader) || (ts->shuffle && ts->loader_seed != ct_loader_seed(a->loader)))
        return ct_error_set(CT_ERR_INVALID,
                            "the checkpoint's loader %s (seed %" PRIu64 "), this run's %s (seed %" PRIu64
                            "): the resumed batches would differ; use the saved run's loader settings",
                            ts->shuffle ? "shuffles" : "does not shuffle", ts->loader_seed,
                            ct_loader_shuffles(a->loader) ? "shuffles" : "does not", ct_loader_seed(a->loader));
    /* under tensor parallelism the loader splits over the data-parallel ranks only */
    const int lw = a->mesh ? a->mesh->dp : ct_pg_size(a->pg);
    const int64_t g_old = ts->batch_size * ts->loader_world, g_new = ct_loader_batch_size(a->loader) * lw;
    const int64_t seen = r0->position * g_old;
    if (seen % g_new)
        return ct_error_set(CT_ERR_INVALID,
                            "the checkpoint stopped %" PRId64 " samples into epoch %" PRId64 " (batch %" PRId64
                            " x %" PRId64 " ranks); a global batch of %" PRId64 " (batch %" PRId64 " x %d ranks) does "
                            "not divide it: keep batch_size x ranks = %" PRId64 " to resume at that sample",
                            seen, r0->epoch, ts->batch_size, ts->loader_world, g_new, ct_loader_batch_size(a->loader),
                            lw, g_old);
    s->epoch = r0->epoch, s->position = seen / g_new;
    if (s->position > ct_loader_num_batches(a->loader))
        return ct_error_set(CT_ERR_INVALID, "the checkpoint's loader position %" PRId64 " is past this run's %" PRId64
                            " batches per epoch: another dataset?", s->position, ct_loader_num_batches(a->loader));
    return CT_OK;
}

/* This rank's generator on resume (docs/checkpoints.md, "Generators"). */
static void stage_rng(const ct_accelerator *a, staged *s)
{
    const cti_trainer_state *ts = &s->ts;
    const int rank = ct_pg_rank(a->pg);
    const ct_rng *now = ct_rng_default();
    if (!ts->lockstep && rank < ts->nranks) {
        s->rng = (ct_rng){ts->ranks[rank].rng_seed, ts->ranks[rank].rng_offset};
        return;
    }
    s->rng.offset = ts->ranks[0].rng_offset;
    if (rank == 0) s->rng.seed = ts->ranks[0].rng_seed;
    else if (ts->lockstep && ts->seeded) s->rng.seed = ts->seed_base + (ts->seed_per_rank ? (uint64_t)rank : 0);
    else s->rng.seed = now->seed;
}

static void note(const ct_accelerator *a, const char *dir, const char *what)
{
    if (ct_pg_rank(a->pg) == 0) fprintf(stderr, "ctrain: load_state '%s': %s\n", dir, what);
}

static ct_status stage(ct_accelerator *a, const char *dir, staged *s)
{
    const int rank = ct_pg_rank(a->pg), world = ct_pg_size(a->pg);
    cti_ckpt_file *files = NULL;
    int n = 0;
    ct_status st = cti_ckpt_read_manifest(dir, false, &s->info, &files, &n, NULL);
    /* each rank checks its share of the checksums; the agreement after staging tells all */
    if (!st) st = cti_ckpt_verify_files(dir, files, n, rank, world, NULL);
    free(files);
    if (!st) st = cti_ckpt_read_trainer_state(dir, &s->ts);
    if (st) return st;
    if (s->ts.nranks < 1) return ct_error_set(CT_ERR_FORMAT, "%s/%s: no generator state", dir, CT_CKPT_STATE);
    if (s->ts.step != s->info.step)
        return ct_error_set(CT_ERR_FORMAT, "checkpoint '%s': %s says step %" PRId64 " but %s says %" PRId64
                            ": files of two saves", dir, CT_CKPT_MANIFEST, s->info.step, CT_CKPT_STATE, s->ts.step);
    if (a->opt && !s->info.optimizer[0])
        return ct_error_set(CT_ERR_INVALID, "checkpoint '%s' has no optimizer state, but this run prepared one", dir);
    if (a->opt) st = stage_optimizer(a, dir, s);
    if (!st && a->fp8 && s->ts.has_fp8) st = stage_fp8(a, dir, s);
    else if (!st && (a->fp8 != NULL) != s->ts.has_fp8)
        note(a, dir, a->fp8 ? "the checkpoint has no fp8 scaling state (saved without fp8): the fp8 scales start afresh"
                            : "the checkpoint's fp8 scaling state is not used (this run is not fp8)");
    if (!st && a->scaling != s->ts.has_scaler)
        note(a, dir, a->scaling ? "the checkpoint has no loss scaler (saved without fp16): the scaler starts afresh"
                                : "the checkpoint's fp16 loss scaler is not used (this run is not fp16)");
    if (!st) st = stage_objects(a, dir, s);
    if (!st && a->loader) st = stage_loader(a, s);
    if (!st && a->sched && !s->ts.has_sched)
        st = ct_error_set(CT_ERR_INVALID, "checkpoint '%s' has no scheduler position, but this run prepared one", dir);
    if (!st && s->ts.accumulation_steps != a->K)
        note(a, dir, "gradient_accumulation_steps differs from the saved run's: the optimizer steps now cover another "
                     "number of micro-batches");
    if (!st) stage_rng(a, s);
    const char *why = NULL;
    if (!st && a->mesh && !(st = cti_accel_megatron_rng_stage(a, dir, &s->has_tp_rng, &s->tp_rng, &why)) && why)
        note(a, dir, why);
    return st;
}

/* Writes what s holds into the run. Only an object's own load_state_dict, the model's
 * read (I/O) or no memory can fail here, each before the rest is written. */
static ct_status commit(ct_accelerator *a, const char *dir, staged *s)
{
    ct_status st = CT_OK;
    for (int k = 0; k < a->nobjects && !st; k++) {
        st = a->objects[k].load_state_dict(a->objects[k].obj, &s->dicts[k]);
        if (st) ct_error_prefix("registered object '%s': load_state_dict: ", a->objects[k].name);
    }
    if (!st && a->model) {
        char path[4200];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, CT_CKPT_MODEL);
        st = ct_accelerator_load_model(a, a->model, stat(path, &sb) ? dir : path);
    }
    if (st) return st;
    if (s->has_opt && (st = ct_optimizer_restore(a->opt, &s->spec))) return st;
    if (s->fp8[0] && (st = ct_fp8_state_import(a->fp8, s->fp8))) return st;
    if (a->scaling && s->ts.has_scaler) {
        a->scaler.scale = s->ts.scale;
        a->scaler.good_steps = (int)s->ts.good_steps;
        a->scaler.overflows = (int)s->ts.overflows;
        a->scaler.steps = s->ts.scaler_steps;
        a->scaler.skipped = s->ts.scaler_skipped;
        a->scaler.unscaled = a->scaler.last_skipped = false;
    }
    if (a->sched && (st = ct_scheduler_set_position(a->sched, s->ts.sched_position))) return st;
    if (a->loader && (st = ct_loader_set_cursor(a->loader, s->epoch, s->position))) return st;
    *ct_rng_default() = s->rng;
    if (s->has_tp_rng) cti_accel_megatron_rng_commit(a, &s->tp_rng);
    a->micro = 0, a->sync = true, a->found_inf = false, a->backward_ran = false;
    /* low-precision copies of the old weights must not be reused */
    ct_autocast_clear_cache();
    return CT_OK;
}

ct_status ct_accelerator_load_state(ct_accelerator *acc, const char *dir)
{
    if (!acc) return ct_error_set(CT_ERR_INVALID, "accelerator_load_state: accelerator is NULL");
    const int rank = ct_pg_rank(acc->pg), world = ct_pg_size(acc->pg);
    char latest[4096];
    ct_status st = acc->prepared ? CT_OK : ct_error_set(CT_ERR_INVALID, "call ct_accelerator_prepare first");
    if (!st && !dir) {
        st = ct_checkpoint_latest(acc->project_dir, latest, sizeof latest);
        if (!st) dir = latest;
    }
    staged s = {0};
    if (!st) st = stage(acc, dir, &s);
    st = cti_ckpt_agree(acc, st);
    if (!st) st = commit(acc, dir, &s);
    st = cti_ckpt_agree(acc, st);
    if (!st) {
        const char *base = strrchr(dir, '/');
        const int64_t i = cti_ckpt_auto_index(base ? base + 1 : dir);
        if (i >= 0 && acc->cfg.project.automatic_checkpoint_naming && i + 1 > acc->iteration) acc->iteration = i + 1;
        char *copy = strdup(dir);
        if (copy) free(acc->last_checkpoint), acc->last_checkpoint = copy;
    }
    staged_free(&s);
    return st ? ct_error_prefix("accelerator_load_state (rank %d of %d, '%s'): ", rank, world, dir ? dir : "(none)")
              : CT_OK;
}
