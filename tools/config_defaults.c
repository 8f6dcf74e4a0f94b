/* The launch configuration's defaults and where its default file lives
 * (tools/config_file.h). */
#include "tools/config_file.h"

#include <stdlib.h>
#include <string.h>

#include "core/cuda.h"

void ct_cluster_config_defaults(ct_cluster_config *c)
{
    /* Accelerate's ClusterConfig defaults, as `accelerate config default` writes them */
    *c = (ct_cluster_config){
        .compute_environment = "LOCAL_MACHINE",
        .distributed_type = CT_DIST_NO,
        .mixed_precision = "no",
        .use_cpu = !ct_cuda_is_available(),
        .num_machines = 1,
        .num_processes = 1,
        .main_process_port = -1,
        .rdzv_backend = "static",
        .main_training_function = "main",
        .fp8 = {.margin = -1},
        .deepspeed = {.zero_stage = 2, .offload_optimizer_device = "none", .offload_param_device = "none",
                      .gradient_accumulation_steps = 1, .gradient_clipping = -1},
        /* no fsdp_auto_wrap_policy: as in Accelerate, one unit for the whole model
         * unless a file or an answer names a policy */
        .fsdp = {.sharding_strategy = "FULL_SHARD",
                 .backward_prefetch = "BACKWARD_PRE", .state_dict_type = "FULL_STATE_DICT",
                 .use_orig_params = true, .sync_module_states = true, .cpu_ram_efficient_loading = true,
                 .reshard_after_forward = true},
        .megatron = {.tp_degree = 1, .pp_degree = 1, .num_micro_batches = 1, .gradient_clipping = -1},
    };
}

ct_status ct_cluster_config_default_path(char *buf, size_t n)
{
    const char *env = getenv("CTRAIN_CONFIG_FILE");
    int w;
    if (env && *env) {
        w = snprintf(buf, n, "%s", env);
    } else {
        const char *cache = getenv("XDG_CACHE_HOME");
        const char *home = getenv("HOME");
        if (cache && *cache) w = snprintf(buf, n, "%s/ctrain/default_config.yaml", cache);
        else if (home && *home) w = snprintf(buf, n, "%s/.cache/ctrain/default_config.yaml", home);
        else
            return ct_error_set(CT_ERR_INVALID, "config: neither CTRAIN_CONFIG_FILE, XDG_CACHE_HOME nor HOME is set: "
                                                "no place for the default configuration file");
    }
    if (w < 0 || (size_t)w >= n)
        return ct_error_set(CT_ERR_INVALID, "config: the default configuration file's path is longer than %zu bytes", n - 1);
    return CT_OK;
}
