/* ctrain launch — start the local ranks of a distributed job and watch them.
 *
 *     ctrain launch --num_processes 4 ./train --steps 100
 *
 * User documentation (every flag, each rank's environment, failure and restart
 * behaviour): docs/launch.md. The pieces:
 *   tools/launch_args.c  flags -> ct_launch_opts, the help text, and each rank's
 *                        environment (what the flags mean to a rank);
 *   tools/launch_rdzv.c  the elastic rendezvous's rounds (--min_nodes, --max_nodes);
 *   tools/launch.c       the supervisor: a libuv loop that spawns the ranks, relays
 *                        their output line by line, forwards signals, stops the group
 *                        when one rank fails and restarts it when allowed.
 *
 * These are the `ctrain` command's functions, not libctrain's: they may print to
 * stdout/stderr and they return process exit codes, but they never exit() — main
 * does, with what they return.
 *
 * Thread-safety: single-threaded. ct_launch_main installs signal handlers and reads
 * the process environment; call it once, from main.
 */
#ifndef CT_TOOLS_LAUNCH_H
#define CT_TOOLS_LAUNCH_H

#include <stdbool.h>
#include <stdio.h>

#include "core/error.h"
#include "dist/store.h"
#include "tools/config_file.h"

/* Exit codes of the launcher itself (a rank's failure passes through its own
 * status, or 128 + signal). */
#define CT_LAUNCH_EXIT_SETUP 1       /* the launcher could not set up (log dir, free port, libuv), or the
                                     * elastic rendezvous failed (too few nodes, the host lost) */
#define CT_LAUNCH_EXIT_USAGE 2       /* a bad flag, value or a missing PROGRAM */
#define CT_LAUNCH_EXIT_NOT_EXEC 126  /* PROGRAM exists but cannot be executed */
#define CT_LAUNCH_EXIT_NOT_FOUND 127 /* PROGRAM not found */

#define CT_LAUNCH_DEFAULT_PORT 29500
#define CT_LAUNCH_DEFAULT_RDZV_TIMEOUT_S 900.0 /* torchrun's join timeout */
#define CT_LAUNCH_DEFAULT_RDZV_LAST_CALL_S 3.0
/* Longest output line relayed whole; longer ones are split into pieces this long. */
#define CT_LAUNCH_LINE_MAX 65536

typedef struct ct_launch_opts {
    int num_processes;    /* total across machines, >= 1 */
    int num_machines;     /* >= 1, divides num_processes */
    int machine_rank;     /* 0 .. num_machines-1 */
    int local_processes;  /* num_processes / num_machines (derived) */
    char main_process_ip[256];
    int main_process_port; /* 0 .. 65535; 0 = pick a free one (one machine only) */
    bool cpu;
    int threads;           /* threads per process, >= 1 (default derived) */
    bool threads_explicit; /* given by --num_cpu_threads_per_process */
    int grad_accum;        /* 0 = not given */
    const char *mixed_precision; /* NULL = not given; else "no", "fp16", "bf16", "fp8" (static) */
    const char *fp8_format;      /* NULL = not given; "hybrid" or "e4m3" (static) */
    const char *fp8_amax_compute_algo; /* NULL = not given; "max" or "most_recent" (static) */
    int fp8_amax_history_len;    /* 0 = not given; 1 .. 2^20 */
    int fp8_margin;              /* 0 .. 64, when fp8_margin_given */
    bool fp8_margin_given;
    bool fp8_embedding_and_head;
    int tee;               /* 0 none, 1 stdout, 2 stderr, 3 both */
    const char *log_dir;   /* NULL = none; borrowed from argv */
    int max_restarts;      /* >= 0 */
    bool elastic;          /* the elastic rendezvous (--rdzv_backend c10d, --min_nodes, --max_nodes):
                            * rounds over the launchers' store (tools/launch_rdzv.h) */
    const char *rdzv_backend; /* NULL = not given; "static" or "c10d" */
    int min_nodes, max_nodes; /* elastic: 1 <= min <= max = num_machines; 0 = not given */
    bool num_machines_given;  /* --num_machines on the command line (not from the file) */
    double rdzv_timeout_s;    /* > 0: a round must close within it (default 900) */
    double rdzv_last_call_s;  /* >= 0: with min_nodes joined, close after this long without
                               * another (default 3) */
    bool same_network;        /* --same_network: accepted, means nothing more here */
    double monitor_interval_s; /* > 0 */
    bool use_deepspeed, use_fsdp, use_megatron_lm;
    const char *sharding[24]; /* the sharding flags' values in SHARDING_FLAGS order (launch_args.c),
                               * NULL = not given; borrowed from argv */
    char gpu_ids[256];     /* --gpu_ids: "" or "all" (CUDA_VISIBLE_DEVICES untouched), else "0,2" */
    bool debug;            /* --debug: CTRAIN_DEBUG=1 */
    const char *config_file; /* --config_file; NULL = not given; borrowed from argv */
    char config_path[1024];  /* the configuration file read ("" = none) */
    bool config_default;     /* config_path is the default file (no --config_file given) */
    ct_cluster_launch_args file_args; /* the file's flags; sharding[] may borrow from them */
    bool help;             /* --help was given: print ct_launch_usage, run nothing */
    char job_id[40];       /* CTRAIN_JOB_ID for the ranks: random on one machine unless
                            * exported; "" (inherit) on several machines */
    char store_token[CT_STORE_MAX_TOKEN + 1]; /* CTRAIN_STORE_TOKEN for the ranks: the exported one,
                            * else random on one machine; "" (none) on several machines */
    char **program_argv;   /* PROGRAM and its ARGS, NULL-terminated; borrowed from argv */
} ct_launch_opts;

/* Parses `launch [flags] PROGRAM [ARGS...]`; argv[0] is "launch". Fills *o with
 * the flags and their defaults. The configuration file (--config_file, else the
 * default file when it exists: ct_cluster_config_default_path) gives the defaults
 * that the command line's flags override; a bad file is CT_ERR_INVALID naming it. CT_ERR_INVALID with a one-line message naming the
 * flag and value (ct_last_error) on a bad flag, value or combination, or when
 * PROGRAM is missing (unless --help). Strings in *o borrow from argv. */
ct_status ct_launch_args_parse(int argc, char **argv, ct_launch_opts *o);

/* The help text of `ctrain launch`. */
void ct_launch_usage(FILE *f);

/* The environment of one local rank: a copy of this process's environment with
 * RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
 * MASTER_PORT, CTRAIN_RESTART_COUNT and the CTRAIN_* settings of *o replaced or
 * added. port is the resolved MASTER_PORT (never 0). Returns a new NULL-terminated
 * array owned by the caller (free with ct_launch_env_free), or NULL (CT_ERR_NOMEM). */
char **ct_launch_env_new(const ct_launch_opts *o, int local_rank, int port, int restart_count);
/* The same for a round of the elastic rendezvous: RANK = node_rank x local_processes +
 * local_rank, WORLD_SIZE = nodes x local_processes, GROUP_RANK = node_rank, and
 * GROUP_WORLD_SIZE = nodes and CTRAIN_RDZV_ROUND = round added. */
char **ct_launch_env_round(const ct_launch_opts *o, int local_rank, int port, int restart_count, int node_rank,
                           int nodes, int round);
void ct_launch_env_free(char **env);

/* Runs the job described by *o (already parsed) to completion and returns the
 * launcher's exit code: 0 when every rank exited 0, the first failing rank's
 * status (128 + signal if it was killed), 128 + signal when the launcher was
 * interrupted, or one of CT_LAUNCH_EXIT_*. */
int ct_launch_run(const ct_launch_opts *o);

/* A TCP port free on this machine now (bound to port 0 and released); what names the
 * purpose in the error. */
ct_status ct_launch_free_port(const char *what, int *port);

/* `ctrain launch ...`: parse, print help or a usage error, run. argv[0] is "launch". */
int ct_launch_main(int argc, char **argv);

#endif
