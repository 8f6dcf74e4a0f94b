/* The `ctrain` command: `ctrain SUBCOMMAND [ARGS...]`, as `accelerate` is.
 *
 * Subcommands live in a table; each is a function given its own argv (argv[0] is
 * the subcommand's name) that returns the process exit code. Exit codes of the
 * command itself: 0 for help and --version, 2 for a usage error.
 */
#include <stdio.h>
#include <string.h>

#include "tools/bench.h"
#include "tools/checkpoint_cmd.h"
#include "tools/config_cmd.h"
#include "tools/env.h"
#include "tools/estimate_memory.h"
#include "tools/generate_cmd.h"
#include "tools/launch.h"
#include "tools/merge_weights.h"
#include "tools/test_cmd.h"
#include "tools/tokenizer_cmd.h"

#define CT_CLI_VERSION "0.1.0"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand COMMANDS[] = {
    {"launch", ct_launch_main, "run a program as the local ranks of a distributed job"},
    {"config", ct_config_main, "write, show or update the launch configuration file (Accelerate's format)"},
    {"test", ct_test_main, "check that this launch configuration works: collectives and a short training run"},
    {"estimate-memory", ct_estimate_memory_main, "bytes per rank of training a model, per strategy, precision and ranks"},
    {"bench", ct_bench_main, "shard strategies side by side: tokens/s, memory per rank, bytes sent; CSV and plot"},
    {"env", ct_env_main, "this machine, its libraries, each dtype's GEMM path, thread and job settings"},
    {"merge-weights", ct_merge_weights_main, "merge a sharded checkpoint (SHARDED_STATE_DICT) into one file"},
    {"generate", ct_generate_main, "continue a prompt with a causal language model (Hugging Face layout)"},
    {"checkpoint", ct_checkpoint_main, "describe a training-state checkpoint (save_state) and verify its files"},
    {"tokenizer", ct_tokenizer_main, "train a byte-level BPE tokenizer (as HF tokenizers), encode text to a .bin"},
};

/* Run by ctrain itself (ctrain bench starts its ranks as `ctrain bench-rank`); not in the help. */
static const subcommand HIDDEN[] = {
    {"bench-rank", ct_bench_rank_main, "one rank of a `ctrain bench` run"},
};

#define N_COMMANDS (sizeof COMMANDS / sizeof *COMMANDS)
#define N_HIDDEN (sizeof HIDDEN / sizeof *HIDDEN)

static void usage(FILE *f)
{
    fputs("usage: ctrain [--help] [--version] COMMAND [ARGS...]\n\ncommands:\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-15s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fputs("\n`ctrain COMMAND --help` describes a command.\n", f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        printf("ctrain %s\n", CT_CLI_VERSION);
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS + N_HIDDEN; i++) {
        const subcommand *c = i < N_COMMANDS ? &COMMANDS[i] : &HIDDEN[i - N_COMMANDS];
        if (!strcmp(cmd, c->name)) {
            int code = c->run(argc - 1, argv + 1);
            /* Flushes the help text and anything else buffered before exit. */
            if (fflush(stdout) != 0 && code == 0) code = 1;
            return code;
        }
    }
    fprintf(stderr, "ctrain: unknown command '%s' (ctrain --help lists the commands)\n", cmd);
    return 2;
}
