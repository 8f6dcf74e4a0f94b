/* Tests for `ctrain config`'s questionnaire (tools/config_ask.c), driven the way a
 * person drives it: through a pseudo-terminal.
 *
 * Each test forks a child whose input and output are the terminal's slave side; the
 * child runs ct_config_ask on streams over it and then writes the resulting fields
 * as key=value lines (the dump below). The parent, on the master side, waits for each
 * expected question before typing its answer, with a deadline per step (the child is
 * killed when a question does not come), and compares the dump with values written
 * out by hand from the answers given. Because the child asks one question at a time
 * and the parent waits for the next expected one, a question asked out of order or
 * one too many stalls the script and fails the test. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tests/pty_session.h"
#include "tests/tmpdir.h"
#include "tools/config_ask.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

/* ---- the child: the questionnaire on the terminal, then its result ------------------ */

static const char *dist_name(ct_dist_type t)
{
    static const char *const names[] = {"NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP", "MEGATRON_LM"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

static void dump(FILE *f, const ct_cluster_config *c)
{
    fprintf(f, "compute_environment=%s\ndistributed_type=%s\nmixed_precision=%s\nuse_cpu=%d\n",
            c->compute_environment, dist_name(c->distributed_type), c->mixed_precision, c->use_cpu);
    fprintf(f, "num_machines=%d\nmachine_rank=%d\nnum_processes=%d\nmain_process_ip=%s\nmain_process_port=%d\n",
            c->num_machines, c->machine_rank, c->num_processes, c->main_process_ip, c->main_process_port);
    fprintf(f, "gpu_ids=%s\nnum_cpu_threads_per_process=%d\ngradient_accumulation_steps=%d\nsame_network=%d\ndebug=%d\n",
            c->gpu_ids, c->num_cpu_threads_per_process, c->gradient_accumulation_steps, c->same_network, c->debug);
    fprintf(f, "rdzv_backend=%s\n", c->rdzv_backend);
    fprintf(f, "fp8.fp8_format=%s\nfp8.amax_history_len=%d\nfp8.amax_compute_algo=%s\nfp8.margin=%d\n",
            c->fp8.fp8_format, c->fp8.amax_history_len, c->fp8.amax_compute_algo, c->fp8.margin);
    fprintf(f, "deepspeed.zero_stage=%d\ndeepspeed.offload_optimizer_device=%s\ndeepspeed.offload_param_device=%s\n",
            c->deepspeed.zero_stage, c->deepspeed.offload_optimizer_device, c->deepspeed.offload_param_device);
    fprintf(f, "deepspeed.gradient_accumulation_steps=%d\ndeepspeed.gradient_clipping=%g\n",
            c->deepspeed.gradient_accumulation_steps, c->deepspeed.gradient_clipping);
    fprintf(f, "deepspeed.deepspeed_config_file=%s\ndeepspeed.zero3_init_flag=%d\n", c->deepspeed.deepspeed_config_file,
            c->deepspeed.zero3_init_flag);
    fprintf(f, "fsdp.sharding_strategy=%s\nfsdp.offload_params=%d\nfsdp.auto_wrap_policy=%s\n", c->fsdp.sharding_strategy,
            c->fsdp.offload_params, c->fsdp.auto_wrap_policy);
    fprintf(f, "fsdp.transformer_layer_cls_to_wrap=%s\nfsdp.min_num_params=%ld\nfsdp.backward_prefetch=%s\n",
            c->fsdp.transformer_layer_cls_to_wrap, c->fsdp.min_num_params, c->fsdp.backward_prefetch);
    fprintf(f, "fsdp.state_dict_type=%s\nfsdp.forward_prefetch=%d\nfsdp.use_orig_params=%d\n", c->fsdp.state_dict_type,
            c->fsdp.forward_prefetch, c->fsdp.use_orig_params);
    fprintf(f, "fsdp.cpu_ram_efficient_loading=%d\nfsdp.sync_module_states=%d\nfsdp.reshard_after_forward=%d\n",
            c->fsdp.cpu_ram_efficient_loading, c->fsdp.sync_module_states, c->fsdp.reshard_after_forward);
}

typedef void (*config_setup)(ct_cluster_config *c);

typedef struct {
    ct_config_ask_machine m;
    config_setup setup;
} child_args;

static void child_main(const char *slave, void *arg)
{
    const child_args *a = arg;
    pty_child_attach(slave);
    FILE *in = fdopen(0, "r"), *out = fdopen(1, "w");
    if (!in || !out) _exit(123);
    ct_cluster_config c, before;
    ct_cluster_config_defaults(&c);
    if (a->setup) a->setup(&c);
    memcpy(&before, &c, sizeof c);
    ct_status st = ct_config_ask(in, out, &a->m, &c);
    fprintf(out, "\n=== result\nstatus=%s\nerror=%s\nuntouched=%d\n", st == CT_OK ? "ok" : "error",
            st == CT_OK ? "" : ct_last_error(), memcmp(&before, &c, sizeof c) == 0);
    /* what `ctrain config` checks before writing: every path must pass */
    fprintf(out, "check=%s\n", st != CT_OK ? "-" : ct_cluster_config_check(&c) == CT_OK ? "ok" : ct_last_error());
    dump(out, &c);
    fprintf(out, "=== end\n");
    fflush(out);
#ifdef __SANITIZE_ADDRESS__
    /* _exit skips LeakSanitizer's check at exit: run it here (a leak ends with 3) */
    if (__lsan_do_recoverable_leak_check()) _exit(3);
#endif
    _exit(0);
}

static void start(int gpus, int cores, config_setup setup)
{
    static child_args args; /* the child's copy of the test's memory */
    args = (child_args){{.gpus = gpus, .cores = cores}, setup};
    pty_start(child_main, &args);
}

/* Answers the questions, then waits for the child's result and its clean exit. */
static void play(const pty_step *steps, size_t n)
{
    pty_play(steps, n);
    pty_expect("=== end\n");
    int status = pty_wait_exit();
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child ended with status %#x", status);
}

static const char *value_of(const char *key);

/* play, and for a completed questionnaire, the configuration's own check */
static void play_checked(const pty_step *steps, size_t n)
{
    play(steps, n);
    if (!strcmp(value_of("status"), "ok"))
        cr_expect_str_eq(value_of("check"), "ok", "ct_cluster_config_check refused the answers:\n%s", S.buf);
}

#define PLAY(...)                                             \
    do {                                                      \
        static const pty_step steps_[] = {__VA_ARGS__};       \
        play_checked(steps_, sizeof steps_ / sizeof *steps_); \
    } while (0)

/* The value the child dumped for key ("key=value" after "=== result"). */
static const char *value_of(const char *key)
{
    static char v[1100];
    const char *r = strstr(S.buf, "\n=== result\n");
    cr_assert_not_null(r, "no result in:\n%s", S.buf);
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s=", key);
    const char *p = strstr(r, pat);
    cr_assert_not_null(p, "no %s in the result:\n%s", key, r);
    p += strlen(pat);
    size_t k = strcspn(p, "\n");
    cr_assert_lt(k, sizeof v);
    memcpy(v, p, k);
    v[k] = 0;
    return v;
}

/* Checks "key=value" pairs, NULL-terminated. */
static void check_values(const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    for (const char *kv = first; kv; kv = va_arg(ap, const char *)) {
        const char *eq = strchr(kv, '=');
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        cr_expect_str_eq(value_of(key), eq + 1, "%s: got \"%s\", expected \"%s\"; the terminal showed:\n%s", key,
                         value_of(key), eq + 1, S.buf);
    }
    va_end(ap);
}

#define count_of pty_count

static void cleanup(void) { pty_stop(); }

TestSuite(config_ask, .fini = cleanup);

/* ---- the questionnaire's paths ------------------------------------------------------ */

Test(config_ask, defaults_on_a_machine_without_gpus, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"How many CPU threads should each process use? [8]: ", ""}, /* 8 cores / 1 process */
         {"Do you wish to use mixed precision?", ""},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "compute_environment=LOCAL_MACHINE", "distributed_type=NO", "num_machines=1",
                 "machine_rank=0", "num_processes=1", "use_cpu=1", "gpu_ids=", "num_cpu_threads_per_process=8",
                 "mixed_precision=no", "gradient_accumulation_steps=1", NULL);
    /* no GPU anywhere: not as a machine type, not as a question */
    const char *result = strstr(S.buf, "=== result");
    cr_assert_null(memmem(S.buf, (size_t)(result - S.buf), "GPU", 3), "a GPU was mentioned:\n%s", S.buf);
    cr_expect_eq(count_of("  1) multi-CPU\n"), 1);
}

Test(config_ask, multi_cpu_with_four_processes, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "1"},
         {"How many different machines will you use (use more than 1 for multi-node training)? [1]: ", ""},
         {"Should distributed operations be checked while running for errors?", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", ""},
         {"How many processes should be used for distributed training? [2]: ", "4"},
         {"How many CPU threads should each process use? [2]: ", ""}, /* 8 cores / 4 processes */
         {"Do you wish to use mixed precision?", "bf16"},
         {"How many gradient accumulation steps do you want to use? [1]: ", "4"});
    check_values("status=ok", "distributed_type=MULTI_CPU", "use_cpu=1", "num_machines=1", "num_processes=4",
                 "num_cpu_threads_per_process=2", "mixed_precision=bf16", "gradient_accumulation_steps=4", "debug=0",
                 NULL);
}

Test(config_ask, deepspeed_zero3_with_cpu_offload_and_clipping, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "multi-cpu"}, /* a name, in another case */
         {"How many different machines will you use", ""},
         {"Should distributed operations be checked", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", "yes"},
         {"Do you want to specify a json file to a DeepSpeed config? [yes/NO]: ", ""},
         {"What should be your DeepSpeed's ZeRO optimization stage?", "3"},
         {"Where to offload optimizer states?", "cpu"},
         {"Where to offload parameters?", "1"},
         {"How many gradient accumulation steps you're passing in your script? [1]: ", "2"},
         {"Do you want to use gradient clipping? [yes/NO]: ", "Y"},
         {"What is the gradient clipping value? [1]: ", "0.5"},
         {"Do you want to enable `deepspeed.zero.Init` when using ZeRO Stage-3", ""},
         {"How many processes should be used for distributed training? [2]: ", ""},
         {"How many CPU threads should each process use? [4]: ", ""},
         {"Do you wish to use mixed precision?", "2"});
    check_values("status=ok", "distributed_type=DEEPSPEED", "use_cpu=1", "num_processes=2", "deepspeed.zero_stage=3",
                 "deepspeed.offload_optimizer_device=cpu", "deepspeed.offload_param_device=cpu",
                 "deepspeed.gradient_accumulation_steps=2", "deepspeed.gradient_clipping=0.5",
                 "deepspeed.deepspeed_config_file=", "deepspeed.zero3_init_flag=0", "mixed_precision=bf16",
                 "gradient_accumulation_steps=0", "num_cpu_threads_per_process=4", NULL);
    /* DeepSpeed was chosen: FSDP and the top-level accumulation are not asked */
    cr_expect_eq(count_of("FullyShardedDataParallel"), 0);
    cr_expect_eq(count_of("do you want to use?"), 0);
}

Test(config_ask, deepspeed_json_file_must_be_readable, .timeout = 60)
{
    make_tmpdir_with("/tmp/ct_cfgask_");
    FILE *f = fopen(path_of("ds_config.json"), "w");
    cr_assert_not_null(f);
    fputs("{\"zero_optimization\": {\"stage\": 3}}\n", f);
    fclose(f);
    char missing[300], good[300];
    snprintf(missing, sizeof missing, "%s", path_of("missing.json"));
    snprintf(good, sizeof good, "%s", path_of("ds_config.json"));
    start(0, 4, NULL);
    pty_step steps[] = {
        {"In which compute environment are you running?", ""},
        {"Which type of machine are you using?", ""},
        {"Do you want to use DeepSpeed? [yes/NO]: ", "y"},
        {"Do you want to specify a json file to a DeepSpeed config? [yes/NO]: ", "YES"},
        {"Please enter the path to the json DeepSpeed config file: ", ""}, /* no default: asked again */
        {"An answer is needed here.\nPlease enter the path to the json DeepSpeed config file: ", missing},
        {"Please enter the path of a readable ds_config.json.\n", tmpdir}, /* a directory */
        {"is not a file. Please enter the path of a ds_config.json.\n", good},
        {"Do you want to enable `deepspeed.zero.Init` when using ZeRO Stage-3", "yes"},
        {"How many processes should be used for distributed training? [1]: ", ""},
        {"How many CPU threads should each process use? [4]: ", ""},
        /* the json file's fp16/bf16 blocks decide the precision: not asked */
    };
    play_checked(steps, sizeof steps / sizeof *steps);
    remove_tmpdir();
    char want[400];
    snprintf(want, sizeof want, "deepspeed.deepspeed_config_file=%s", good);
    check_values("status=ok", "distributed_type=DEEPSPEED", want, "deepspeed.zero3_init_flag=1", "num_processes=1",
                 "mixed_precision=", NULL);
    cr_expect_eq(count_of("Cannot read "), 1);
    cr_expect_eq(count_of("No such file or directory"), 1);
    cr_expect_eq(count_of("mixed precision"), 0);
}

Test(config_ask, fsdp_full_shard_wrapping_block, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "1"},
         {"How many different machines will you use", ""},
         {"Should distributed operations be checked", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", "no"},
         {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", "yes"},
         {"What should be your sharding strategy?", "FULL_SHARD"},
         {"Do you want to offload parameters and gradients to CPU? [yes/NO]: ", ""},
         {"What should be your auto wrap policy?\n  0) TRANSFORMER_BASED_WRAP\n  1) SIZE_BASED_WRAP\n  2) NO_WRAP\n"
          "Number or name [0: TRANSFORMER_BASED_WRAP]: ",
          ""},
         {"to wrap (the GPT's is `Block`): [Block]: ", "Block"},
         {"What should be your FSDP's backward prefetch policy?", "BACKWARD_POST"},
         {"What should be your FSDP's state dict type?", "1"},
         {"Do you want to enable FSDP's forward prefetch policy? [yes/NO]: ", "no"},
         {"Do you want to enable FSDP's `use_orig_params` feature? [YES/no]: ", ""},
         {"Do you want to enable CPU RAM efficient model loading? [YES/no]: ", "n"},
         {"broadcast module parameters from rank 0 at the start? [YES/no]: ", ""},
         {"How many processes should be used for distributed training? [2]: ", "4"},
         {"How many CPU threads should each process use? [2]: ", ""},
         {"Do you wish to use mixed precision?", ""},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "distributed_type=FSDP", "use_cpu=1", "num_processes=4", "fsdp.sharding_strategy=FULL_SHARD",
                 "fsdp.offload_params=0", "fsdp.auto_wrap_policy=TRANSFORMER_BASED_WRAP",
                 "fsdp.transformer_layer_cls_to_wrap=Block", "fsdp.backward_prefetch=BACKWARD_POST",
                 "fsdp.state_dict_type=SHARDED_STATE_DICT", "fsdp.forward_prefetch=0", "fsdp.use_orig_params=1",
                 "fsdp.cpu_ram_efficient_loading=0", "fsdp.sync_module_states=1", "fsdp.reshard_after_forward=1",
                 "mixed_precision=no", "gradient_accumulation_steps=1", NULL);
}

Test(config_ask, fsdp_size_wrap_and_shard_grad_op, .timeout = 60)
{
    start(0, 2, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "MULTI_CPU"},
         {"How many different machines will you use", ""},
         {"Should distributed operations be checked", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", "y"},
         {"What should be your sharding strategy?", "shard_grad_op"},
         {"Do you want to offload parameters and gradients to CPU? [yes/NO]: ", "yes"},
         {"What should be your auto wrap policy?", "SIZE_BASED_WRAP"},
         {"minimum number of parameters for Default Auto Wrapping Policy? [100000000]: ", "2000"},
         {"What should be your FSDP's backward prefetch policy?", "2"},
         {"What should be your FSDP's state dict type?", ""},
         {"Do you want to enable FSDP's forward prefetch policy? [yes/NO]: ", "yes"},
         {"Do you want to enable FSDP's `use_orig_params` feature? [YES/no]: ", "no"},
         {"Do you want to enable CPU RAM efficient model loading? [YES/no]: ", ""}, /* yes: no sync question */
         {"How many processes should be used for distributed training? [2]: ", "3"},
         {"How many CPU threads should each process use? [1]: ", ""}, /* 2 cores / 3 processes, at least 1 */
         {"Do you wish to use mixed precision?", "fp16"},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "distributed_type=FSDP", "fsdp.sharding_strategy=SHARD_GRAD_OP", "fsdp.offload_params=1",
                 "fsdp.auto_wrap_policy=SIZE_BASED_WRAP", "fsdp.min_num_params=2000",
                 "fsdp.backward_prefetch=NO_PREFETCH", "fsdp.state_dict_type=FULL_STATE_DICT",
                 "fsdp.forward_prefetch=1", "fsdp.use_orig_params=0", "fsdp.cpu_ram_efficient_loading=1",
                 "fsdp.sync_module_states=1", "fsdp.reshard_after_forward=0", "num_processes=3",
                 "num_cpu_threads_per_process=1", "mixed_precision=fp16", NULL);
    cr_expect_eq(count_of("broadcast module parameters"), 0);
}

Test(config_ask, fsdp_no_shard_has_nothing_to_offload, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "1"},
         {"How many different machines will you use", ""},
         {"Should distributed operations be checked", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", "y"},
         {"What should be your sharding strategy?", "NO_SHARD"},
         {"What should be your auto wrap policy?", "NO_WRAP"},
         {"What should be your FSDP's backward prefetch policy?", ""},
         {"What should be your FSDP's state dict type?", ""},
         {"Do you want to enable FSDP's forward prefetch policy? [yes/NO]: ", ""},
         {"Do you want to enable FSDP's `use_orig_params` feature? [YES/no]: ", ""},
         {"Do you want to enable CPU RAM efficient model loading? [YES/no]: ", ""},
         {"How many processes should be used for distributed training? [2]: ", ""},
         {"How many CPU threads should each process use? [4]: ", ""},
         {"Do you wish to use mixed precision?", ""},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "distributed_type=FSDP", "fsdp.sharding_strategy=NO_SHARD", "fsdp.offload_params=0",
                 "fsdp.auto_wrap_policy=NO_WRAP", NULL);
    cr_expect_eq(count_of("Do you want to offload"), 0);
    cr_expect_eq(count_of("class names"), 0);
}

Test(config_ask, deepspeed_stage1_offloads_the_optimizer_only, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "1"},
         {"How many different machines will you use", ""},
         {"Should distributed operations be checked", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", "y"},
         {"Do you want to specify a json file to a DeepSpeed config? [yes/NO]: ", ""},
         {"What should be your DeepSpeed's ZeRO optimization stage?", "1"},
         {"Where to offload optimizer states?", "cpu"},
         {"How many gradient accumulation steps you're passing in your script? [1]: ", ""},
         {"Do you want to use gradient clipping? [yes/NO]: ", ""},
         {"How many processes should be used for distributed training? [2]: ", ""},
         {"How many CPU threads should each process use? [4]: ", ""},
         {"Do you wish to use mixed precision?", ""});
    check_values("status=ok", "distributed_type=DEEPSPEED", "deepspeed.zero_stage=1",
                 "deepspeed.offload_optimizer_device=cpu", "deepspeed.offload_param_device=none",
                 "deepspeed.gradient_clipping=-1", "deepspeed.zero3_init_flag=0", NULL);
    cr_expect_eq(count_of("Where to offload parameters?"), 0);
}

Test(config_ask, multi_node, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "1"},
         {"How many different machines will you use (use more than 1 for multi-node training)? [1]: ", "2"},
         {"What is the rank of this machine (0 to 1)? [0]: ", "2"},
         {"Please enter a whole number from 0 to 1, not \"2\".\nWhat is the rank of this machine (0 to 1)? [0]: ", "1"},
         {"What is the IP address of the machine that will host the main process? ", "10.0.0.1"},
         {"What is the port you will use to communicate with the main process? [29500]: ", "0"},
         {"Please enter a whole number from 1 to 65535, not \"0\".\n", "29501"},
         {"Are all the machines on the same local network? Answer `no` if nodes are on the cloud and/or on different "
          "network hosts [YES/no]: ",
          ""},
         {"Should distributed operations be checked while running for errors? This can avoid timeout issues but will "
          "be slower. [yes/NO]: ",
          "yes"},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", ""},
         {"How many processes should be used for distributed training (in total, across all machines)? [2]: ", "3"},
         {"Please enter a multiple of 2 from 2 to 1048576, not \"3\".\n", "8"},
         {"How many CPU threads should each process use? [2]: ", ""}, /* 8 cores / 4 processes here */
         {"Do you wish to use mixed precision?", ""},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "distributed_type=MULTI_CPU", "num_machines=2", "machine_rank=1",
                 "main_process_ip=10.0.0.1", "main_process_port=29501", "same_network=1", "rdzv_backend=static", "debug=1",
                 "num_processes=8", "num_cpu_threads_per_process=2", NULL);
}

/* Machines on different networks: Accelerate then asks for the rendezvous backend; c10d
 * is ctrain's elastic rendezvous (launch --rdzv_backend c10d). */
Test(config_ask, multi_node_on_different_networks_asks_the_rendezvous, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "1"},
         {"How many different machines will you use (use more than 1 for multi-node training)? [1]: ", "3"},
         {"What is the rank of this machine (0 to 2)? [0]: ", "0"},
         {"What is the IP address of the machine that will host the main process? ", "10.0.0.1"},
         {"What is the port you will use to communicate with the main process? [29500]: ", ""},
         {"Are all the machines on the same local network? Answer `no` if nodes are on the cloud and/or on different "
          "network hosts [YES/no]: ",
          "no"},
         {"What rendezvous backend will you use?\n  0) static  (a fixed set of machines)\n  1) c10d  (elastic: "
          "rounds of the launchers at the main process)\nNumber or name [0: static]: ",
          "c10d"},
         {"Should distributed operations be checked while running for errors?", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", ""},
         {"How many processes should be used for distributed training (in total, across all machines)? [3]: ", ""},
         {"How many CPU threads should each process use?", ""},
         {"Do you wish to use mixed precision?", ""},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "num_machines=3", "same_network=0", "rdzv_backend=c10d", "num_processes=3", NULL);
}

Test(config_ask, fp8_recipe, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"How many CPU threads should each process use? [8]: ", "8"},
         {"Do you wish to use mixed precision?\n  0) no\n  1) fp16\n  2) bf16\n  3) fp8\nNumber or name [0: no]: ", "fp8"},
         {"What margin should be used for gradient scaling? [0]: ", "2"},
         {"Which weight format should be used?", "e4m3"},
         {"What length of history should be used for the amax scaling factor computation? [1024]: ", "16"},
         {"Which algorithm should be used for the amax scaling factor computation?", "most_recent"},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "mixed_precision=fp8", "fp8.margin=2", "fp8.fp8_format=E4M3", "fp8.amax_history_len=16",
                 "fp8.amax_compute_algo=most_recent", NULL);
}

Test(config_ask, bad_answers_are_asked_again, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", "1"},
         {"it does not start SageMaker jobs. Please choose 0: This machine.\n"
          "In which compute environment are you running?",
          "this machine"},
         {"Which type of machine are you using?", "7"},
         {"Please enter a number from 0 to 1 or one of: No distributed training, multi-CPU; not \"7\".\n"
          "Which type of machine are you using?\n  0) No distributed training\n  1) multi-CPU\n"
          "Number or name [0: No distributed training]: ",
          "multi-GPU"}, /* not offered without a GPU */
         {"not \"multi-GPU\".\nWhich type of machine are you using?", "0"},
         {"Do you want to use DeepSpeed? [yes/NO]: ", "maybe"},
         {"Please enter yes or no (y, yes, n or no, in any case), not \"maybe\".\n"
          "Do you want to use DeepSpeed? [yes/NO]: ",
          "N"},
         {"How many CPU threads should each process use? [8]: ", "0"},
         {"Please enter a whole number from 1 to 65536, not \"0\".\n"
          "How many CPU threads should each process use? [8]: ",
          "4x"},
         {"not \"4x\".\nHow many CPU threads should each process use? [8]: ", "3"},
         {"Do you wish to use mixed precision?", "fp32"},
         {"Please enter a number from 0 to 3 or one of: no, fp16, bf16, fp8; not \"fp32\".\n", "1"},
         {"How many gradient accumulation steps do you want to use? [1]: ", "-1"},
         {"Please enter a whole number from 1 to 1073741824, not \"-1\".\n", "2"});
    check_values("status=ok", "distributed_type=NO", "num_cpu_threads_per_process=3", "mixed_precision=fp16",
                 "gradient_accumulation_steps=2", NULL);
    cr_expect_eq(count_of("Which type of machine are you using?"), 3);
    cr_expect_eq(count_of("Do you want to use DeepSpeed?"), 2);
}

static void setup_existing(ct_cluster_config *c)
{
    c->distributed_type = CT_DIST_DEEPSPEED;
    c->use_cpu = true;
    c->num_processes = 4;
    c->num_cpu_threads_per_process = 3;
    snprintf(c->mixed_precision, sizeof c->mixed_precision, "fp16");
    c->deepspeed.zero_stage = 1;
    c->deepspeed.gradient_accumulation_steps = 8;
    c->deepspeed.gradient_clipping = 2.5;
}

Test(config_ask, input_ending_early_changes_nothing, .timeout = 60)
{
    start(0, 8, setup_existing);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "0"},
         {"Do you want to use DeepSpeed? [YES/no]: ", "no"},
         {"How many CPU threads should each process use? [3]: ", NULL});
    check_values("status=error",
                 "error=config: the answers ended before the question about the CPU threads per process",
                 "untouched=1", "distributed_type=DEEPSPEED", "num_processes=4", "mixed_precision=fp16", NULL);
}

Test(config_ask, input_ending_at_the_first_question, .timeout = 60)
{
    start(0, 8, NULL);
    PLAY({"In which compute environment are you running?", NULL});
    check_values("status=error", "error=config: the answers ended before the question about the compute environment",
                 "untouched=1", NULL);
}

Test(config_ask, rerun_offers_the_existing_values, .timeout = 60)
{
    start(0, 8, setup_existing);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?\n  0) No distributed training\n  1) multi-CPU\n"
          "Number or name [1: multi-CPU]: ",
          ""},
         {"How many different machines will you use", ""},
         {"Should distributed operations be checked", ""},
         {"Do you want to use DeepSpeed? [YES/no]: ", ""},
         {"Do you want to specify a json file to a DeepSpeed config? [yes/NO]: ", ""},
         {"Number or name [1: 1]: ", ""},
         {"Where to offload optimizer states?\n  0) none\n  1) cpu\nNumber or name [0: none]: ", ""},
         /* stage 1: no parameter offload and no zero.Init question */
         {"How many gradient accumulation steps you're passing in your script? [8]: ", ""},
         {"Do you want to use gradient clipping? [YES/no]: ", ""},
         {"What is the gradient clipping value? [2.5]: ", ""},
         {"How many processes should be used for distributed training? [4]: ", ""},
         {"How many CPU threads should each process use? [3]: ", ""},
         {"Do you wish to use mixed precision?", ""});
    check_values("status=ok", "distributed_type=DEEPSPEED", "num_processes=4", "num_cpu_threads_per_process=3",
                 "mixed_precision=fp16", "deepspeed.zero_stage=1", "deepspeed.gradient_accumulation_steps=8",
                 "deepspeed.gradient_clipping=2.5", "deepspeed.offload_optimizer_device=none", NULL);
    cr_expect_eq(count_of("Where to offload parameters?"), 0);
    cr_expect_eq(count_of("deepspeed.zero.Init"), 0);
}

/* ---- what the machine has ----------------------------------------------------------- */

static void setup_gpu_default(ct_cluster_config *c) { c->use_cpu = false; }

Test(config_ask, two_gpus_offer_multi_gpu_and_gpu_ids, .timeout = 60)
{
    start(2, 8, setup_gpu_default);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?\n  0) No distributed training\n  1) multi-CPU\n  2) multi-GPU\n"
          "Number or name [0: No distributed training]: ",
          "2"},
         {"How many different machines will you use", ""},
         {"Should distributed operations be checked", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"Do you want to use FullyShardedDataParallel? [yes/NO]: ", ""},
         {"How many GPU(s) should be used for distributed training? [2]: ", "3"}, /* 2 GPUs here */
         {"Please enter a whole number from 2 to 2, not \"3\".\n", ""},
         {"What GPU(s) (by id) should be used for training on this machine as a comma-separated list? [all]: ",
          "0,5"},
         {"Please enter \"all\" or GPU ids from 0 to 1 separated by commas (\"0,1\"), not \"0,5\".\n", "1"},
         {"list at least 2 ids, not \"1\".\n", "1,1"},
         {"GPU 1 is listed twice in \"1,1\".\n", "1,0"},
         {"Do you wish to use mixed precision?", "bf16"},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "distributed_type=MULTI_GPU", "use_cpu=0", "num_processes=2", "gpu_ids=1,0",
                 "num_cpu_threads_per_process=0", "mixed_precision=bf16", NULL);
    cr_expect_eq(count_of("CPU threads"), 0);
}

Test(config_ask, one_gpu_one_process_may_still_run_on_the_cpu, .timeout = 60)
{
    start(1, 4, setup_gpu_default);
    PLAY({"In which compute environment are you running?", ""},
         {"Which type of machine are you using?", "2"},
         {"How many different machines will you use", ""}, /* one machine with one GPU: not multi-GPU */
         {"multi-GPU needs two GPUs; this machine has one: choose \"No distributed training\", or more than one "
          "machine.\nWhich type of machine are you using?",
          "0"},
         {"Do you want to run your training on CPU only (even if a GPU is available)? [yes/NO]: ", ""},
         {"Do you want to use DeepSpeed? [yes/NO]: ", ""},
         {"What GPU(s) (by id) should be used for training on this machine as a comma-separated list? [all]: ", "0"},
         {"Do you wish to use mixed precision?", ""},
         {"How many gradient accumulation steps do you want to use? [1]: ", ""});
    check_values("status=ok", "distributed_type=NO", "use_cpu=0", "num_processes=1", "gpu_ids=0", NULL);
}
