/* Tests for accel/model_shards.c, accel/model_load.c and ct_shard_load_params
 * (parallel/shard_state.c): FSDP's SHARDED_STATE_DICT end to end, on fork()ed ranks.
 *
 * Each strategy (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD; FULL_SHARD also in bf16)
 * trains a small GPT for two AdamW steps on 2 and on 4 ranks, then saves the model
 * sharded (each rank its slices, no gathering), full (get_state_dict, which gathers:
 * an independent path), and sharded again after unwrap_model. Each merged directory
 * must equal the full file tensor by tensor, in the same order, bit for bit. A fresh
 * run with another world size (and strategy, CPU offload, or DDP) loads the full file,
 * then other values, then the directory: get_state_dict must equal the full file
 * after each load of it. Bad directories (a missing, truncated, corrupt or foreign
 * file, overlapping or missing elements, a regular file) each give their own error,
 * and a failed load leaves the model as it was. `ctrain merge-weights` writes what
 * the library writes and exits 0, 1 or 2. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/safetensors.h"
#include "nn/gpt.h"
#include "optim/optimizer.h"
#include "tests/env_ranks.h"
#include "tests/tmpdir.h"

#define SEQ 8
#define ROWS 2
#define STEPS 2

/* widths no rank count divides (a block holds 11190 parameters, the root 2370), so
 * the last rank's slices end in padding */
static const ct_gpt_config tiny = {.vocab_size = 61, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 30};

static void setup(void) { make_tmpdir_with("/tmp/ct_mshards_"); }
static void teardown(void) { remove_tmpdir(); }

/* One run's settings: FSDP's names, ranks, and HYBRID's ranks per shard group. */
typedef struct run_cfg {
    const char *strategy;
    const char *wrap; /* NULL: NO_WRAP */
    int world;
    int group;        /* LOCAL_WORLD_SIZE, which HYBRID takes as its shard group; 0: world */
    bool offload;
    const char *precision; /* mixed_precision; NULL: "no" */
} run_cfg;

typedef struct model_case {
    run_cfg train, load;
    int files; /* rank files the sharded save must write */
} model_case;

/* Rank r's tokens at step s, (ROWS, SEQ + 1): fixed, whatever the strategy. */
static ct_tensor *batch(int s, int r)
{
    int64_t ids[ROWS * (SEQ + 1)];
    uint32_t x = 2654435761u * (uint32_t)(s * 8 + r + 1);
    for (int i = 0; i < ROWS * (SEQ + 1); i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int64_t)((x >> 8) % (uint32_t)tiny.vocab_size);
    }
    return ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(ROWS, SEQ + 1), ids);
}

/* The Accelerator of rc with SHARDED_STATE_DICT, prepared with m and opt. */
static ct_accelerator *accelerator(int rank, const run_cfg *rc, ct_gpt *m, ct_optimizer *opt,
                                   const char *state_dict_type)
{
    /* HYBRID's shard group is the ranks of one machine: as if on machines of group ranks */
    const int group = rc->group ? rc->group : rc->world;
    char v[16];
    snprintf(v, sizeof v, "%d", group), setenv("LOCAL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", rank % group), setenv("LOCAL_RANK", v, 1);
    setenv("CTRAIN_NUM_THREADS", "1", 1); /* 4 ranks on 2 cores */
    const bool blocks = rc->wrap && !strcmp(rc->wrap, "TRANSFORMER_BASED_WRAP");
    ct_fsdp_plugin p = {.sharding_strategy = rc->strategy,
                        .auto_wrap_policy = rc->wrap,
                        .transformer_cls_names_to_wrap = blocks ? "Block" : NULL,
                        .min_num_params = 3000,
                        .cpu_offload = rc->offload,
                        .state_dict_type = state_dict_type};
    ct_accelerator *acc = ct_accelerator_new(
        &(ct_accelerator_config){.fsdp_plugin = &p, .mixed_precision = rc->precision ? rc->precision : "no"});
    if (acc && ct_accelerator_prepare(acc, &m->base, opt, NULL, NULL)) {
        ct_accelerator_free(acc);
        return NULL;
    }
    return acc;
}

/* The model's state, gathered, into path (rank 0 writes it). */
static ct_status write_state(ct_accelerator *acc, ct_gpt *m, const char *path)
{
    ct_state_dict sd;
    ct_status st = ct_accelerator_get_state_dict(acc, &m->base, &sd);
    if (!st && ct_accelerator_is_main_process(acc))
        st = ct_safetensors_save(path, sd.n, (const char *const *)sd.names, sd.tensors, 0, NULL, NULL);
    ct_state_dict_free(&sd);
    return st;
}

static int fail(int rank, const char *what)
{
    fprintf(stderr, "rank %d, %s: %s\n", rank, what, ct_last_error());
    return 1;
}

/* Trains STEPS steps, saves dir/ck (sharded) and dir/full.safetensors (gathered). */
static int train_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)world;
    const model_case *c = ctx;
    int rc = 0;
    CT_FRAME {
        ct_set_seed(11);
        ct_gpt *m = ct_gpt_new(&tiny);
        ct_param_list pl;
        ct_module_named_tensors(&m->base, false, &pl);
        ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 1e-2, .weight_decay = 0.1});
        ct_accelerator *acc = accelerator(rank, &c->train, m, opt, "SHARDED_STATE_DICT");
        ct_status st = acc ? CT_OK : ct_last_status();
        for (int s = 0; s < STEPS && !st; s++) CT_FRAME {
                ct_tensor *t = batch(s, rank);
                ct_tensor *x = ct_tensor_contiguous(ct_tensor_narrow(t, 1, 0, SEQ));
                ct_tensor *y = ct_tensor_contiguous(ct_tensor_narrow(t, 1, 1, SEQ));
                ct_tensor *l = ct_gpt_loss(m, x, y);
                st = l ? ct_accelerator_backward(acc, l) : ct_last_status();
                if (!st) st = ct_optimizer_step(opt);
                ct_optimizer_zero_grad(opt);
            }
        char ck[512], full[512], unwrapped[512];
        snprintf(ck, sizeof ck, "%s/ck", dir);
        snprintf(full, sizeof full, "%s/full.safetensors", dir);
        snprintf(unwrapped, sizeof unwrapped, "%s/ck_unwrapped", dir);
        if (st) rc = fail(rank, "training");
        else if (ct_accelerator_save_model(acc, &m->base, ck)) rc = fail(rank, "sharded save");
        else if (write_state(acc, m, full)) rc = fail(rank, "full state");
        /* unwrapped, the engine's parts are the model's own parameters */
        else if (ct_accelerator_unwrap_model(acc, &m->base) != &m->base) rc = fail(rank, "unwrap");
        else if (ct_accelerator_save_model(acc, &m->base, unwrapped)) rc = fail(rank, "sharded save after unwrap");
        ct_accelerator_free(acc);
        ct_optimizer_free(opt);
        ct_param_list_free(&pl);
        ct_module_free(&m->base);
    }
    return rc;
}

/* A fresh model (other weights) loads the full file and writes its state to
 * dir/loaded_full.safetensors, then loads dir/ck and writes it to
 * dir/loaded.safetensors; with offload, after a step of lr 0, which copies the
 * master slices into the compute ones (a master left unloaded would show). */
static int load_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)world;
    const model_case *c = ctx;
    int rc = 0;
    CT_FRAME {
        ct_set_seed(99);
        ct_gpt *m = ct_gpt_new(&tiny);
        ct_param_list pl;
        ct_module_named_tensors(&m->base, false, &pl);
        ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.weight_decay = 0.1});
        ct_accelerator *acc = accelerator(rank, &c->load, m, opt, "SHARDED_STATE_DICT");
        char ck[512], out[512], full[512], out_full[512];
        snprintf(ck, sizeof ck, "%s/ck", dir);
        snprintf(out, sizeof out, "%s/loaded.safetensors", dir);
        snprintf(full, sizeof full, "%s/full.safetensors", dir);
        snprintf(out_full, sizeof out_full, "%s/loaded_full.safetensors", dir);
        ct_status st = acc ? ct_accelerator_load_model(acc, &m->base, full) : ct_last_status();
        if (!st) st = write_state(acc, m, out_full);
        /* other values in between: the second load must write every element */
        if (!st) CT_FRAME {
                ct_state_dict sd;
                st = ct_accelerator_get_state_dict(acc, &m->base, &sd);
                for (int i = 0; i < sd.n && !st; i++) st = ct_tensor_fill_(sd.tensors[i], 0.5);
                if (!st && ct_accelerator_is_main_process(acc))
                    st = ct_safetensors_save(out, sd.n, (const char *const *)sd.names, sd.tensors, 0, NULL, NULL);
                ct_state_dict_free(&sd);
                if (!st) st = ct_accelerator_wait_for_everyone(acc);
                if (!st) st = ct_accelerator_load_model(acc, &m->base, out);
            }
        if (!st) st = ct_accelerator_load_model(acc, &m->base, ck);
        if (!st && c->load.offload) CT_FRAME {
                ct_tensor *t = batch(0, rank);
                ct_tensor *l = ct_gpt_loss(m, ct_tensor_contiguous(ct_tensor_narrow(t, 1, 0, SEQ)),
                                           ct_tensor_contiguous(ct_tensor_narrow(t, 1, 1, SEQ)));
                st = l ? ct_accelerator_backward(acc, l) : ct_last_status();
                if (!st) st = ct_optimizer_set_lr(opt, 0);
                if (!st) st = ct_optimizer_step(opt);
            }
        if (st) rc = fail(rank, "load");
        else if (write_state(acc, m, out)) rc = fail(rank, "loaded state");
        ct_accelerator_free(acc);
        ct_optimizer_free(opt);
        ct_param_list_free(&pl);
        ct_module_free(&m->base);
    }
    return rc;
}

/* a and b hold the same tensors in the same order, with the same dtypes, shapes and bits. */
static void assert_same_file(const char *a, const char *b)
{
    ct_safetensors *fa = ct_safetensors_open(a), *fb = ct_safetensors_open(b);
    cr_assert(fa && fb, "%s", ct_last_error());
    cr_assert_eq(ct_safetensors_count(fa), ct_safetensors_count(fb), "%s: %d tensors, %s: %d", a,
                 ct_safetensors_count(fa), b, ct_safetensors_count(fb));
    for (int i = 0; i < ct_safetensors_count(fa); i++) CT_FRAME {
            const char *n = ct_safetensors_name(fa, i);
            cr_assert_str_eq(n, ct_safetensors_name(fb, i), "tensor %d: '%s' in %s, '%s' in %s", i, n, a,
                             ct_safetensors_name(fb, i), b);
            ct_tensor *x = ct_safetensors_get(fa, n), *y = ct_safetensors_get(fb, n);
            cr_assert(x && y && x->dtype == y->dtype && ct_tensor_same_shape(x, y), "'%s' differs in dtype or shape",
                      n);
            cr_assert_eq(memcmp(ct_tensor_data(x), ct_tensor_data(y), ct_tensor_nbytes(x)), 0, "'%s' differs: %s, %s",
                         n, a, b);
        }
    ct_safetensors_close(fa);
    ct_safetensors_close(fb);
}

static int count_files(const char *dir)
{
    int n = 0;
    char name[64];
    for (int r = 0; r < 8; r++)
        for (int k = 1; k <= 8; k++) {
            snprintf(name, sizeof name, "%s/model-rank%05d-of-%05d.safetensors", dir, r, k);
            n += access(name, F_OK) == 0;
        }
    return n;
}

static void round_trip(model_case c)
{
    run_env_ranks(c.train.world, train_rank, tmpdir, &c, 60);
    run_env_ranks(c.load.world, load_rank, tmpdir, &c, 60);
    /* no ranks are forked after this: the merge may use the thread pools */
    cr_assert_eq(count_files(path_of("ck")), c.files);
    cr_assert_eq(ct_sharded_model_merge(path_of("ck"), path_of("merged.safetensors")), CT_OK, "%s", ct_last_error());
    assert_same_file(path_of("merged.safetensors"), path_of("full.safetensors"));
    cr_assert_eq(ct_sharded_model_merge(path_of("ck_unwrapped"), path_of("merged_unwrapped.safetensors")), CT_OK, "%s",
                 ct_last_error());
    assert_same_file(path_of("merged_unwrapped.safetensors"), path_of("full.safetensors"));
    assert_same_file(path_of("loaded_full.safetensors"), path_of("full.safetensors"));
    assert_same_file(path_of("loaded.safetensors"), path_of("full.safetensors"));
}

#define FULL(n) {"FULL_SHARD", "TRANSFORMER_BASED_WRAP", n, 0, false, NULL}
Test(model_shards, full_shard_2_ranks_merges_and_loads_on_4, .init = setup, .fini = teardown, .timeout = 60)
{
    round_trip((model_case){.train = FULL(2), .load = FULL(4), .files = 2});
}
Test(model_shards, full_shard_4_ranks_loads_on_2_with_cpu_offload, .init = setup, .fini = teardown, .timeout = 60)
{
    round_trip((model_case){.train = FULL(4), .load = {"FULL_SHARD", "SIZE_BASED_WRAP", 2, 0, true}, .files = 4});
}
Test(model_shards, shard_grad_op_2_ranks_loads_on_4, .init = setup, .fini = teardown, .timeout = 60)
{
    round_trip((model_case){.train = {"SHARD_GRAD_OP", NULL, 2, 0, false}, .load = FULL(4), .files = 2});
}
Test(model_shards, shard_grad_op_4_ranks_loads_into_ddp_on_2, .init = setup, .fini = teardown, .timeout = 60)
{
    round_trip((model_case){.train = {"SHARD_GRAD_OP", NULL, 4, 0, false}, .load = {"NO_SHARD", NULL, 2, 0, false},
                            .files = 4});
}
/* bf16 mixed precision: 16-bit parameters beside f32 master slices, which are what is
 * saved and what the full state holds */
Test(model_shards, full_shard_bf16_2_ranks_loads_on_4, .init = setup, .fini = teardown, .timeout = 60)
{
    round_trip((model_case){.train = {"FULL_SHARD", "TRANSFORMER_BASED_WRAP", 2, 0, false, "bf16"},
                            .load = {"SHARD_GRAD_OP", NULL, 4, 0, false, "bf16"},
                            .files = 2});
}
/* shard groups of 1 (each rank holds everything: one file) and of 2 (two groups, the
 * first writes: two files) */
Test(model_shards, hybrid_shard_2_ranks_loads_on_4, .init = setup, .fini = teardown, .timeout = 60)
{
    round_trip((model_case){.train = {"HYBRID_SHARD", "TRANSFORMER_BASED_WRAP", 2, 1, false},
                            .load = {"HYBRID_SHARD", "TRANSFORMER_BASED_WRAP", 4, 2, false},
                            .files = 1});
}
Test(model_shards, hybrid_shard_4_ranks_loads_on_2, .init = setup, .fini = teardown, .timeout = 60)
{
    round_trip((model_case){.train = {"HYBRID_SHARD", "TRANSFORMER_BASED_WRAP", 4, 2, false},
                            .load = {"SHARD_GRAD_OP", NULL, 2, 0, false},
                            .files = 2});
}

/* ---- bad input ------------------------------------------------------------------------ */

/* Saves an untrained model sharded into dir/ck on 2 ranks; first tries dir/afile, a
 * regular file, which every rank must refuse naming it. */
static int save_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)world, (void)ctx;
    int rc = 0;
    CT_FRAME {
        ct_set_seed(5);
        ct_gpt *m = ct_gpt_new(&tiny);
        ct_accelerator *acc = accelerator(rank, &(run_cfg)FULL(2), m, NULL, "SHARDED_STATE_DICT");
        char ck[512], afile[512];
        snprintf(ck, sizeof ck, "%s/ck", dir);
        snprintf(afile, sizeof afile, "%s/afile", dir);
        if (!acc) rc = fail(rank, "prepare");
        else if (ct_accelerator_save_model(acc, &m->base, afile) == CT_OK ||
                 !strstr(ct_last_error(), "exists and is not a directory") || !strstr(ct_last_error(), afile))
            rc = fail(rank, "saving over a regular file");
        else if (ct_accelerator_save_model(acc, &m->base, ck)) rc = fail(rank, "sharded save");
        ct_accelerator_free(acc);
        ct_module_free(&m->base);
    }
    return rc;
}

/* A file's tensors and metadata, to write back changed. */
typedef struct file_copy {
    int n, nm;
    const char *names[64];
    ct_tensor *ts[64];
    char keys[96][160], vals[96][160];
} file_copy;

static void read_copy(const char *path, file_copy *c)
{
    ct_safetensors *f = ct_safetensors_open(path);
    cr_assert_not_null(f, "%s", ct_last_error());
    c->n = ct_safetensors_count(f);
    c->nm = ct_safetensors_metadata_count(f);
    cr_assert(c->n <= 64 && c->nm <= 96);
    for (int i = 0; i < c->n; i++) {
        c->names[i] = strdup(ct_safetensors_name(f, i));
        c->ts[i] = ct_tensor_clone(ct_safetensors_get(f, c->names[i])); /* the root frame keeps it */
    }
    for (int k = 0; k < c->nm; k++) {
        snprintf(c->keys[k], sizeof c->keys[k], "%s", ct_safetensors_metadata_key(f, k));
        snprintf(c->vals[k], sizeof c->vals[k], "%s", ct_safetensors_metadata(f, c->keys[k]));
    }
    ct_safetensors_close(f);
}

static void write_copy(const char *path, const file_copy *c)
{
    const char *k[96], *v[96];
    for (int i = 0; i < c->nm; i++) k[i] = c->keys[i], v[i] = c->vals[i];
    cr_assert_eq(ct_safetensors_save(path, c->n, c->names, c->ts, c->nm, k, v), CT_OK, "%s", ct_last_error());
}

static void free_copy(file_copy *c)
{
    for (int i = 0; i < c->n; i++) free((char *)c->names[i]);
}

static char *metadata_of(file_copy *c, const char *key)
{
    for (int k = 0; k < c->nm; k++)
        if (!strcmp(c->keys[k], key)) return c->vals[k];
    cr_assert_fail("no metadata key %s", key);
    return NULL;
}

/* A fresh copy of dir/ck as dir/<name>; returns its path. */
static const char *copy_ck(const char *name)
{
    const char *to = path_of(name);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, path_of("ck"), to);
    cr_assert_eq(system(cmd), 0);
    return to;
}

static void expect_merge_error(const char *dir, const char *a, const char *b)
{
    ct_error_clear();
    cr_assert_neq(ct_sharded_model_merge(dir, path_of("out.safetensors")), CT_OK, "%s: the merge succeeded", dir);
    cr_assert(strstr(ct_last_error(), a) && (!b || strstr(ct_last_error(), b)), "expected '%s'%s%s in: %s", a,
              b ? " and " : "", b ? b : "", ct_last_error());
    cr_assert_neq(access(path_of("out.safetensors"), F_OK), 0, "a failed merge wrote its output");
}

#define F0 "model-rank00000-of-00002.safetensors"
#define F1 "model-rank00001-of-00002.safetensors"

static char *join(const char *dir, const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

Test(model_shards, bad_directories_give_their_own_errors, .init = setup, .fini = teardown, .timeout = 60)
{
    FILE *f = fopen(path_of("afile"), "w");
    cr_assert_not_null(f);
    fputs("not a directory\n", f);
    fclose(f);
    run_env_ranks(2, save_rank, tmpdir, NULL, 60);
    /* the intact checkpoint merges: the cases below fail for their own reason */
    cr_assert_eq(ct_sharded_model_merge(path_of("ck"), path_of("good.safetensors")), CT_OK, "%s", ct_last_error());

    expect_merge_error(path_of("afile"), "is not a directory", path_of("afile"));

    const char *d = copy_ck("missing");
    cr_assert_eq(unlink(join(d, F1)), 0);
    expect_merge_error(d, F1 " is missing (rank 1 of 2)", NULL);

    d = copy_ck("truncated");
    struct stat sb;
    cr_assert_eq(stat(join(d, F1), &sb), 0);
    cr_assert_eq(truncate(join(d, F1), sb.st_size / 2), 0);
    expect_merge_error(d, join(d, F1), "safetensors");

    d = copy_ck("corrupt");
    f = fopen(join(d, F0), "r+b");
    cr_assert_not_null(f);
    fseek(f, 12, SEEK_SET);
    fputs("}}}}", f); /* inside the header's JSON */
    fclose(f);
    expect_merge_error(d, join(d, F0), "safetensors");

    /* a file of a 3-rank save beside this one's */
    d = copy_ck("mixed");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", join(d, F0), join(d, "model-rank00002-of-00003.safetensors"));
    cr_assert_eq(system(cmd), 0);
    expect_merge_error(d, "holds files of 2 and of 3 ranks", NULL);

    /* the same file renamed into this checkpoint: its header says 3 files */
    file_copy c;
    d = copy_ck("foreign");
    read_copy(join(d, F1), &c);
    snprintf(metadata_of(&c, "ctrain.files"), 160, "3");
    write_copy(join(d, F1), &c);
    free_copy(&c);
    expect_merge_error(d, "says it is file 1 of 3, but its name says file 1 of 2", join(d, F1));

    /* a file of another save with the same count */
    d = copy_ck("other_save");
    read_copy(join(d, F1), &c);
    snprintf(metadata_of(&c, "ctrain.checkpoint"), 160, "0123456789abcdef");
    write_copy(join(d, F1), &c);
    free_copy(&c);
    expect_merge_error(d, "files of two saves", join(d, F1));

    /* rank 1's first part moved 5 elements down: they overlap rank 0's, and its last 5
     * elements are then in no file */
    d = copy_ck("overlap");
    read_copy(join(d, F1), &c);
    char key[200], *v = NULL;
    long long b = 0, e = 0;
    for (int i = 0; i < c.n && !v; i++) {
        snprintf(key, sizeof key, "ctrain.part.%s", c.names[i]);
        v = metadata_of(&c, key);
        cr_assert_eq(sscanf(v, "begin=%lld end=%lld", &b, &e), 2);
        if (b < 5) v = NULL;
    }
    cr_assert_not_null(v, "rank 1 holds no part that starts past element 5");
    char rest[160], name[200];
    snprintf(name, sizeof name, "%s", key + strlen("ctrain.part."));
    snprintf(rest, sizeof rest, "%s", strstr(v, " shape="));
    snprintf(v, 160, "begin=%lld end=%lld%.100s", b - 5, e - 5, rest);
    write_copy(join(d, F1), &c);
    free_copy(&c);
    char want[512];
    snprintf(want, sizeof want, "parameter '%s': elements [%lld, %lld) are in both", name, b - 5, b);
    expect_merge_error(d, want, join(d, F0));

    /* rank 1's last tensor dropped: its elements are in no file */
    d = copy_ck("gap");
    read_copy(join(d, F1), &c);
    c.n--;
    snprintf(key, sizeof key, "ctrain.part.%s", c.names[c.n]);
    v = metadata_of(&c, key);
    cr_assert_eq(sscanf(v, "begin=%lld end=%lld", &b, &e), 2);
    for (int k = 0; k < c.nm; k++)
        if (!strcmp(c.keys[k], key)) { /* drop the entry too: the last one takes its place */
            memcpy(c.keys[k], c.keys[c.nm - 1], sizeof c.keys[k]);
            memcpy(c.vals[k], c.vals[c.nm - 1], sizeof c.vals[k]);
            c.nm--;
            break;
        }
    write_copy(join(d, F1), &c);
    c.n++;
    free_copy(&c);
    /* (when the part was the whole parameter, the merge knows it from file 0's list) */
    snprintf(want, sizeof want, "parameter '%s': ", key + strlen("ctrain.part."));
    expect_merge_error(d, want, "are in no file");

    /* the load refuses a bad directory and leaves the model as it was */
    CT_FRAME {
        ct_set_seed(3);
        ct_gpt *m = ct_gpt_new(&tiny);
        ct_tensor *before = ct_tensor_clone(m->wte->weight);
        ct_accelerator *acc = ct_accelerator_new(NULL);
        cr_assert_not_null(acc, "%s", ct_last_error());
        cr_assert_eq(ct_accelerator_prepare(acc, &m->base, NULL, NULL, NULL), CT_OK, "%s", ct_last_error());
        cr_assert_neq(ct_accelerator_load_model(acc, &m->base, path_of("gap")), CT_OK);
        cr_assert(strstr(ct_last_error(), "accelerator_load_model (rank 0") &&
                      strstr(ct_last_error(), "are in no file"),
                  "%s", ct_last_error());
        cr_assert_eq(memcmp(ct_tensor_data(before), ct_tensor_data(m->wte->weight), ct_tensor_nbytes(before)), 0);
        /* one process, replicated: the directory is merged in memory */
        cr_assert_eq(ct_accelerator_load_model(acc, &m->base, path_of("ck")), CT_OK, "%s", ct_last_error());
        cr_assert_eq(ct_module_save(&m->base, path_of("plain.safetensors"), 0, NULL, NULL), CT_OK);
        assert_same_file(path_of("plain.safetensors"), path_of("good.safetensors"));
        ct_accelerator_free(acc);
        ct_module_free(&m->base);

        /* another shape: named, nothing written */
        ct_gpt_config wide = tiny;
        wide.n_embd = 32;
        m = ct_gpt_new(&wide);
        acc = ct_accelerator_new(NULL);
        cr_assert_eq(ct_accelerator_prepare(acc, &m->base, NULL, NULL, NULL), CT_OK, "%s", ct_last_error());
        cr_assert_neq(ct_accelerator_load_model(acc, &m->base, path_of("ck")), CT_OK);
        cr_assert(strstr(ct_last_error(), "'wte.weight' is [61, 30] in"), "%s", ct_last_error());
        ct_accelerator_free(acc);
        ct_module_free(&m->base);
    }
}

/* ---- the command ------------------------------------------------------------------------ */

/* `ctrain merge-weights args`: its exit status; stderr into dir/err. */
static int merge_command(const char *args)
{
    const char *bin = getenv("CTRAIN_BIN");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' merge-weights %s >'%s' 2>'%s'", bin, args, path_of("out"), path_of("err"));
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "%s did not exit", cmd);
    return WEXITSTATUS(st);
}

static bool err_holds(const char *text)
{
    static char buf[4096];
    FILE *f = fopen(path_of("err"), "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    return strstr(buf, text) != NULL;
}

Test(model_shards, merge_weights_command, .init = setup, .fini = teardown, .timeout = 60)
{
    const char *bin = getenv("CTRAIN_BIN");
    if (!bin || !*bin)
        cr_skip_test("CTRAIN_BIN is not set: run through `make test`, or set CTRAIN_BIN to build/bin/ctrain");
    FILE *f = fopen(path_of("afile"), "w");
    cr_assert_not_null(f);
    fclose(f);
    run_env_ranks(2, save_rank, tmpdir, NULL, 60);
    char args[1024];
    snprintf(args, sizeof args, "'%s' '%s'", path_of("ck"), path_of("cli.safetensors"));
    cr_assert_eq(merge_command(args), 0);
    cr_assert_eq(ct_sharded_model_merge(path_of("ck"), path_of("lib.safetensors")), CT_OK, "%s", ct_last_error());
    assert_same_file(path_of("cli.safetensors"), path_of("lib.safetensors"));
    /* an output directory gets model.safetensors, as accelerate merge-weights writes */
    cr_assert_eq(mkdir(path_of("outdir"), 0755), 0);
    snprintf(args, sizeof args, "'%s' '%s'", path_of("ck"), path_of("outdir"));
    cr_assert_eq(merge_command(args), 0);
    assert_same_file(path_of("outdir/model.safetensors"), path_of("lib.safetensors"));

    cr_assert_eq(merge_command("--help"), 0);
    snprintf(args, sizeof args, "'%s'", path_of("ck"));
    cr_assert_eq(merge_command(args), 2);
    cr_assert(err_holds("OUT is missing"));
    cr_assert_eq(merge_command("--unsafe_serialization a b"), 2);
    cr_assert(err_holds("unknown flag '--unsafe_serialization'"));
    snprintf(args, sizeof args, "'%s' '%s'", path_of("afile"), path_of("x.safetensors"));
    cr_assert_eq(merge_command(args), 1);
    cr_assert(err_holds("is not a directory"));
}
