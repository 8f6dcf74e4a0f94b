/* examples/generate/generate.c on a tiny byte-level GPT saved with ct_gpt_save_hf:
 * it prints the prompt and as many new bytes as asked for (the model has no
 * end-of-text token), and fails cleanly on a missing directory. The binary comes
 * from CTRAIN_EXAMPLES (make test sets it). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "nn/gpt.h"
#include "tests/shell.h"
#include "tests/tmpdir.h"

static char out[1 << 14];

static void setup(void) { make_tmpdir_with("/tmp/ct_genex_"); }

/* the example's stdout into out (its length in *n); the exit status */
static int run_example(const char *args, size_t *n)
{
    const char *ex = getenv("CTRAIN_EXAMPLES");
    if (!ex || !*ex) cr_skip_test("CTRAIN_EXAMPLES is not set (make test sets it)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 60 %s/generate %s 2>/dev/null", ex, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    *n = fread(out, 1, sizeof out - 1, p);
    out[*n] = 0;
    return shell_status(pclose(p));
}

Test(generate_example, continues_a_prompt, .init = setup, .fini = remove_tmpdir, .timeout = 90)
{
    ct_set_seed(4);
    ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 256, .block_size = 32, .n_layer = 1, .n_head = 2, .n_embd = 8});
    cr_assert_not_null(m);
    cr_assert_eq(ct_gpt_save_hf(m, tmpdir), CT_OK, "%s", ct_last_error());
    ct_module_free(&m->base);
    char args[256];
    size_t n;
    snprintf(args, sizeof args, "%s 'Hello' 9", tmpdir);
    cr_assert_eq(run_example(args, &n), 0);
    cr_assert_eq(n, 5 + 9 + 1, "%zu bytes", n);
    cr_assert_eq(memcmp(out, "Hello", 5), 0);
    cr_assert_eq(out[14], '\n');
    snprintf(args, sizeof args, "%s/absent x", tmpdir);
    cr_assert_eq(run_example(args, &n), 1);
    cr_assert_eq(run_example("", &n), 2);
}
