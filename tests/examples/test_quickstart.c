/* examples/quickstart.c -- a plain C model whose loss function calls its layers'
 * forward functions directly -- under every strategy flag that docs/strategies.md
 * offers, in every precision, on 2 processes (and ZeRO-2 on 1), unchanged: the final
 * training mse within 1% of the DDP run's in the same precision. Before the engine
 * learnt of parameters read outside a module forward, ZeRO-1/2 trained nothing
 * (the same mse every epoch) and ZeRO-3/FSDP crashed. The binaries come from
 * CTRAIN_BIN and CTRAIN_EXAMPLES (make test sets both). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char out[1 << 16];

/* `ctrain launch` with flags over the quickstart; the mse of its last epoch (rank 0's
 * line, the mean over ranks); asserts the run succeeded and that it learnt. */
static double final_mse(int procs, const char *mp, const char *flags)
{
    const char *ctrain = getenv("CTRAIN_BIN"), *ex = getenv("CTRAIN_EXAMPLES");
    if (!ctrain || !*ctrain || !ex || !*ex) cr_skip_test("CTRAIN_BIN / CTRAIN_EXAMPLES are not set (make test sets them)");
    char cmd[2048];
    /* the time limit only catches a hang: a run takes about half a second */
    snprintf(cmd, sizeof cmd, "timeout 120 %s launch --num_processes %d --main_process_port 0 --mixed_precision %s %s "
             "%s/quickstart 2>&1", ctrain, procs, mp, flags, ex);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed:\n%s", cmd, out);
    const char *first = strstr(out, "epoch 0: train mse "), *last = strstr(out, "epoch 9: train mse ");
    cr_assert(first && last, "%s: no epoch 0 or 9 line:\n%s", cmd, out);
    double m0 = atof(first + strlen("epoch 0: train mse ")), m9 = atof(last + strlen("epoch 9: train mse "));
    /* a strategy that steps nothing keeps the first epoch's mse */
    cr_assert_lt(m9, 0.5 * m0, "%s: the mse went from %g to %g: it did not learn\n%s", cmd, m0, m9, out);
    return m9;
}

static void quickstart_strategies(const char *mp)
{
    static const char *const flags[] = {
        "--use_deepspeed --zero_stage 1",
        "--use_deepspeed --zero_stage 2",
        "--use_deepspeed --zero_stage 3",
        "--use_fsdp",
        "--use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP",
        "--use_fsdp --fsdp_sharding_strategy HYBRID_SHARD",
        "--use_fsdp --fsdp_auto_wrap_policy SIZE_BASED_WRAP --fsdp_min_num_params 100",
        "--use_deepspeed --zero_stage 3 --offload_optimizer_device cpu",
        "--use_fsdp --fsdp_offload_params true",
    };
    const double ddp = final_mse(2, mp, "");
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        double m = final_mse(2, mp, flags[i]);
        cr_expect_leq(fabs(m - ddp), 0.01 * ddp, "%s, %s: final mse %g, DDP's %g", mp, flags[i], m, ddp);
    }
    /* one process sharded is one process plain */
    const double alone = final_mse(1, mp, "");
    double m = final_mse(1, mp, "--use_deepspeed --zero_stage 2");
    cr_expect_leq(fabs(m - alone), 0.01 * alone, "%s, ZeRO-2 on one process: final mse %g, alone %g", mp, m, alone);
}

Test(examples_quickstart, every_strategy_matches_ddp_f32, .timeout = 600) { quickstart_strategies("no"); }
Test(examples_quickstart, every_strategy_matches_ddp_bf16, .timeout = 600) { quickstart_strategies("bf16"); }
Test(examples_quickstart, every_strategy_matches_ddp_fp16, .timeout = 600) { quickstart_strategies("fp16"); }
Test(examples_quickstart, every_strategy_matches_ddp_fp8, .timeout = 600) { quickstart_strategies("fp8"); }
