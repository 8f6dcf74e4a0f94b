/* examples/llama/train.c and examples/finetune/finetune.c, alone and under `ctrain
 * launch --num_processes 2` with a sharded strategy: the loss falls, the files of a
 * Hugging Face model directory are written and `ctrain generate` reads them back, and
 * fine-tuning counts exactly the answer tokens (counted here from the data file, one
 * token per byte for a byte-level model). Binaries from CTRAIN_BIN and
 * CTRAIN_EXAMPLES (make test sets both). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/philox.h"
#include "data/bpe_train.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "tests/shell.h"
#include "tests/tmpdir.h"

static char out[1 << 17];

static const char *bin_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set (make test sets it)", var);
    return v;
}

static int run(const char *cmd)
{
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    return shell_capture(full, out, sizeof out);
}

static void setup(void) { make_tmpdir_with("/tmp/ct_llamaex_"); }

/* tmpdir/text.txt: 300 short varied lines */
static void write_text(void)
{
    static const char *const words[] = {"fox", "dog", "cat", "bird", "fish", "cow"};
    FILE *f = fopen(path_of("text.txt"), "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 300; i++)
        fprintf(f, "The %s number %d jumps over the lazy %s.\n", words[i % 6], i, words[(i * 7 + 3) % 6]);
    fclose(f);
}

static void assert_file(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(access(p, R_OK), 0, "%s was not written: %s", p, out);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* "... val loss A -> B nats/token": B < A */
static void assert_val_loss_falls(const char *marker)
{
    const char *s = strstr(out, marker);
    cr_assert_not_null(s, "no '%s' in: %s", marker, out);
    s = strstr(s, "val loss ");
    double a, b;
    cr_assert(s && sscanf(s, "val loss %lf -> %lf", &a, &b) == 2, "%s", out);
    cr_assert(b < a - 0.05, "val loss %g -> %g did not fall: %s", a, b, out);
}

static void assert_generates(const char *model_dir)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 50 %s generate --model %s --prompt 'The fox' --max_new_tokens 6 --seed 1",
             ctrain, model_dir);
    cr_assert_eq(run(cmd), 0, "%s", out);
    cr_assert(strncmp(out, "The fox", 7) == 0 && strstr(out, "new tokens"), "%s", out);
}

#define LLAMA_TINY                                                                                                   \
    "--vocab_size 320 --hidden 32 --n_layer 2 --n_head 4 --n_kv_head 2 --intermediate 64 --block_size 32 "          \
    "--batch_size 4 --warmup 2 --lr 3e-3 --eval_batches 4 --sample_tokens 8"

Test(llama_examples, train_alone, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    const char *ex = bin_or_skip("CTRAIN_EXAMPLES");
    write_text();
    char cmd[2048], dir[300];
    snprintf(dir, sizeof dir, "%s/run", tmpdir);
    snprintf(cmd, sizeof cmd, "timeout 50 %s/llama_train --data %s --out_dir %s " LLAMA_TINY " --steps 24 --eval_every 12",
             ex, path_of("text.txt"), dir);
    cr_assert_eq(run(cmd), 0, "%s", out);
    cr_assert(strstr(out, "2 layers, 4 heads (2 key/value), hidden 32, intermediate 64, block 32, vocabulary 320"),
              "%s", out);
    cr_assert(strstr(out, "--- sample (8 tokens) ---\nThe "), "%s", out);
    assert_val_loss_falls("trained 24 steps");
    static const char *const files[] = {"tokenizer.json", "config.json", "model.safetensors", "loss.csv"};
    for (int i = 0; i < 4; i++) assert_file(dir, files[i]);
    const char *cfg = slurp(path_of("run/config.json"));
    cJSON *j = cJSON_Parse(cfg);
    cr_assert_not_null(j, "%s", cfg);
    const cJSON *type = cJSON_GetObjectItem(j, "model_type"), *kv = cJSON_GetObjectItem(j, "num_key_value_heads");
    const cJSON *tie = cJSON_GetObjectItem(j, "tie_word_embeddings"), *v = cJSON_GetObjectItem(j, "vocab_size");
    cr_assert(cJSON_IsString(type) && !strcmp(type->valuestring, "llama") && cJSON_IsNumber(kv) &&
                  kv->valueint == 2 && cJSON_IsFalse(tie) && cJSON_IsNumber(v) && v->valueint == 320,
              "%s", cfg);
    cJSON_Delete(j);
    /* one row per step after the header */
    const char *csv = slurp(path_of("run/loss.csv"));
    int rows = 0;
    for (const char *c = csv; *c; c++) rows += *c == '\n';
    cr_assert_eq(rows, 25, "%s", csv);
    assert_generates(dir);
    /* --tokenizer: the file is used as it is, nothing is trained */
    char tok[320];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    snprintf(cmd, sizeof cmd, "timeout 50 %s/llama_train --data %s --out_dir %s2 --tokenizer %s " LLAMA_TINY
                              " --vocab_size 280 --steps 2 --eval_every 2",
             ex, path_of("text.txt"), dir, tok);
    cr_assert_eq(run(cmd), 0, "%s", out);
    cr_assert(!strstr(out, "tokenizer: trained") && strstr(out, "vocabulary 320;"), "%s", out);
    char *a = strdup(slurp(tok)), *b = strdup(slurp(path_of("run2/tokenizer.json")));
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
}

/* FSDP, one unit per decoder layer; a checkpoint midway, then --resume auto goes on to more steps */
Test(llama_examples, train_under_launch_fsdp_and_resume, .init = setup, .fini = remove_tmpdir, .timeout = 90)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    write_text();
    char cmd[4096], dir[300];
    snprintf(dir, sizeof dir, "%s/run", tmpdir);
    const char *fsdp = "--use_fsdp --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP "
                       "--fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer";
    snprintf(cmd, sizeof cmd,
             "timeout 40 %s launch --num_processes 2 --main_process_port 0 %s %s/llama_train --data %s --out_dir %s "
             LLAMA_TINY " --steps 16 --eval_every 8 --save_every 8 --threads 1",
             ctrain, fsdp, ex, path_of("text.txt"), dir);
    cr_assert_eq(run(cmd), 0, "%s", out);
    cr_assert(strstr(out, "[rank0] Llama: ") && strstr(out, "2 process(es)"), "%s", out);
    cr_assert(strstr(out, "[rank0] sharded (FULL over 2 ranks)"), "%s", out);
    cr_assert(strstr(out, "[rank0] saved checkpoint") && !strstr(out, "[rank1] trained"), "%s", out);
    assert_val_loss_falls("[rank0] trained 16 steps");
    assert_file(dir, "checkpoints/checkpoint_1");
    assert_file(dir, "model.safetensors");
    assert_generates(dir);
    snprintf(cmd, sizeof cmd,
             "timeout 40 %s launch --num_processes 2 --main_process_port 0 %s %s/llama_train --data %s --out_dir %s "
             LLAMA_TINY " --steps 20 --eval_every 8 --save_every 8 --threads 1 --resume auto",
             ctrain, fsdp, ex, path_of("text.txt"), dir);
    cr_assert_eq(run(cmd), 0, "%s", out);
    cr_assert(strstr(out, "[rank0] resumed from ") && strstr(out, "at step 16") &&
                  strstr(out, "[rank0] trained 4 steps (resumed at step 17)"),
              "%s", out);
}

/* tmpdir/qa.txt: n pairs; returns the bytes of their answers as finetune counts them
 * (the text after "### Answer:" without trailing white space, plus "\n") */
static long write_pairs(int n)
{
    static const char *const answers[] = {"Paris.", "Seven days.", "Blue, mostly.", "Honey and wax.", "Eight."};
    FILE *f = fopen(path_of("qa.txt"), "w");
    cr_assert_not_null(f);
    long bytes = 0;
    for (int i = 0; i < n; i++) {
        const char *a = answers[i % 5];
        /* a two-line question, and blank lines of more than one "\n" between blocks */
        fprintf(f, "### Question: question number %d,\nasked twice?\n### Answer: %s  \n\n%s", i, a, i % 2 ? "\n" : "");
        bytes += 1 + (long)strlen(a) + 1; /* the leading space, the answer, "\n" */
    }
    fclose(f);
    return bytes;
}

/* A byte-level GPT-2 (no tokenizer.json): every answer byte is one counted token,
 * nothing of the prompts; the answer loss falls; the saved directory loads again. */
Test(llama_examples, finetune_counts_only_answer_tokens, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    const char *ex = bin_or_skip("CTRAIN_EXAMPLES");
    ct_set_seed(3);
    ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 256, .block_size = 128, .n_layer = 1, .n_head = 2, .n_embd = 32});
    cr_assert_not_null(m);
    char base[300], tuned[300], cmd[2048];
    snprintf(base, sizeof base, "%s/base", tmpdir);
    snprintf(tuned, sizeof tuned, "%s/tuned", tmpdir);
    cr_assert_eq(mkdir(base, 0755), 0);
    cr_assert_eq(ct_gpt_save_hf(m, base), CT_OK, "%s", ct_last_error());
    ct_module_free(&m->base);
    ct_frame_reset_root();
    long answer_bytes = write_pairs(10);
    snprintf(cmd, sizeof cmd,
             "timeout 50 %s/finetune --model %s --data %s --out_dir %s --epochs 6 --batch_size 4 --lr 1e-2 --warmup 1 "
             "--sample_tokens 4",
             ex, base, path_of("qa.txt"), tuned);
    cr_assert_eq(run(cmd), 0, "%s", out);
    char want[200];
    snprintf(want, sizeof want, "10 pairs, ");
    cr_assert(strstr(out, want), "%s", out);
    const char *s = strstr(out, " tokens of which ");
    long counted = -1;
    cr_assert(s && sscanf(s, " tokens of which %ld answer tokens", &counted) == 1, "%s", out);
    cr_assert_eq(counted, answer_bytes, "counted %ld tokens, the answers hold %ld bytes: %s", counted, answer_bytes, out);
    s = strstr(out, "answer loss after: ");
    double after, before;
    cr_assert(s && sscanf(s, "answer loss after: %lf (%lf before", &after, &before) == 2, "%s", out);
    cr_assert(after < before - 0.5, "answer loss %g -> %g: %s", before, after, out);
    assert_file(tuned, "config.json");
    assert_file(tuned, "model.safetensors");
    /* reloads: a second fine-tuning starts from the first one's answer loss */
    snprintf(cmd, sizeof cmd, "timeout 50 %s/finetune --model %s --data %s --out_dir %s/again --epochs 1 --lr 1e-9 "
                              "--sample_tokens 0",
             ex, tuned, path_of("qa.txt"), tmpdir);
    cr_assert_eq(run(cmd), 0, "%s", out);
    double again;
    s = strstr(out, "answer loss before: ");
    cr_assert(s && sscanf(s, "answer loss before: %lf", &again) == 1, "%s", out);
    cr_assert_float_eq(again, after, 1e-3, "reloaded %g, saved %g: %s", again, after, out);
}

/* A Llama with its own BPE tokenizer, tuned under ZeRO-3 on two processes: the loss
 * falls, and the directory it writes (with tokenizer.json) generates. */
Test(llama_examples, finetune_llama_under_launch_zero3, .init = setup, .fini = remove_tmpdir, .timeout = 90)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    write_text();
    char base[300], tuned[300], cmd[4096], tok[320];
    snprintf(base, sizeof base, "%s/base", tmpdir);
    snprintf(tuned, sizeof tuned, "%s/tuned", tmpdir);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", base);
    cr_assert_eq(mkdir(base, 0755), 0);
    const char *text = path_of("text.txt");
    static const char *const specials[] = {"<|endoftext|>"};
    cr_assert_eq(ct_bpe_train(&(ct_bpe_train_config){.vocab_size = 300, .special_tokens = specials, .nspecial = 1},
                              &text, 1, tok),
                 CT_OK, "%s", ct_last_error());
    ct_set_seed(5);
    ct_llama *m = ct_llama_new(&(ct_llama_config){.vocab_size = 300, .hidden_size = 32, .intermediate_size = 64,
                                                  .num_hidden_layers = 2, .num_attention_heads = 4,
                                                  .num_key_value_heads = 2, .max_position_embeddings = 128,
                                                  .token_ids_set = true, .bos_token_id = 0, .eos_token_id = 0,
                                                  .pad_token_id = -1});
    cr_assert_not_null(m, "%s", ct_last_error());
    cr_assert_eq(ct_llama_save_pretrained(m, base), CT_OK, "%s", ct_last_error());
    ct_module_free(&m->base);
    ct_frame_reset_root();
    write_pairs(8);
    snprintf(cmd, sizeof cmd,
             "timeout 70 %s launch --num_processes 2 --main_process_port 0 --use_deepspeed --zero_stage 3 "
             "%s/finetune --model %s --data %s --out_dir %s --epochs 6 --batch_size 2 --lr 1e-2 --warmup 1 "
             "--sample_tokens 4 --threads 1",
             ctrain, ex, base, path_of("qa.txt"), tuned);
    cr_assert_eq(run(cmd), 0, "%s", out);
    cr_assert(strstr(out, "[rank0] llama model from ") && strstr(out, "8 pairs") && strstr(out, "2 process(es)"), "%s",
              out);
    const char *s = strstr(out, "[rank0] answer loss after: ");
    double after, before;
    cr_assert(s && sscanf(s, "[rank0] answer loss after: %lf (%lf before", &after, &before) == 2, "%s", out);
    cr_assert(after < before - 0.5, "answer loss %g -> %g: %s", before, after, out);
    assert_file(tuned, "tokenizer.json");
    assert_file(tuned, "config.json");
    assert_generates(tuned);
}

/* A data file that is not question/answer blocks is refused with the block named. */
Test(llama_examples, finetune_refuses_a_bad_block, .init = setup, .fini = remove_tmpdir, .timeout = 30)
{
    const char *ex = bin_or_skip("CTRAIN_EXAMPLES");
    ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 256, .block_size = 16, .n_layer = 1, .n_head = 1, .n_embd = 8});
    cr_assert_not_null(m);
    cr_assert_eq(ct_gpt_save_hf(m, tmpdir), CT_OK, "%s", ct_last_error());
    ct_module_free(&m->base);
    ct_frame_reset_root();
    FILE *f = fopen(path_of("bad.txt"), "w");
    cr_assert_not_null(f);
    fprintf(f, "### Question: one?\n### Answer: yes.\n\n### Question: two, with no answer line\n");
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout 20 %s/finetune --model %s --data %s", ex, tmpdir, path_of("bad.txt"));
    cr_assert_eq(run(cmd), 1, "%s", out);
    cr_assert(strstr(out, "bad.txt: block 2 does not start with \"### Question:\" or has no line starting with "
                          "\"### Answer:\""),
              "%s", out);
}
