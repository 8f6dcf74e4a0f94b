#!/usr/bin/env bash
# The Accelerate oracle for the launch configuration file (tests/tools/test_config_cmd.c).
#
#   tests/tools/accelerate_config.sh CTRAIN_BIN WORKDIR
#
# 1. The real `accelerate config default`, and DeepSpeed ZeRO-2, ZeRO-3 and FSDP
#    FULL_SHARD files written by Accelerate's own ClusterConfig(...).to_yaml_file, are
#    read by ctrain: `ctrain launch --config_file` gives rank 0 the environment
#    written out below for each.
# 2. What ctrain writes (config default, YAML and JSON; a DeepSpeed and an FSDP file
#    from `ctrain config update`) loads in Accelerate's load_config_from_file with the
#    values written out below, without an unknown-key error.
#
# Accelerate 1.5.2 is the newest that runs on Debian's python3-torch 1.13. It lives in
# build/tests/venv-accelerate, made once and reused. Exit 0 when all agree, 77 (with a
# "skip: REASON" line) when the venv cannot be made, 1 on a disagreement.
set -u
bin=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$root/build/tests/venv-accelerate
py=$venv/bin/python

skip() { echo "skip: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

if ! "$py" -c 'import accelerate, yaml' >/dev/null 2>&1; then
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    log=$work/venv.log
    timeout 60 /usr/bin/python3 -m venv --system-site-packages "$venv" >"$log" 2>&1 ||
        skip "python3 -m venv failed (see python3-venv): $(tail -1 "$log")"
    timeout 150 "$venv/bin/pip" install -q --disable-pip-version-check --no-deps accelerate==1.5.2 >>"$log" 2>&1 ||
        { rm -rf "$venv"; skip "pip could not install accelerate==1.5.2 (no network?): $(tail -1 "$log")"; }
    timeout 150 "$venv/bin/pip" install -q --disable-pip-version-check pyyaml psutil huggingface_hub safetensors \
        >>"$log" 2>&1 || { rm -rf "$venv"; skip "pip could not install Accelerate's dependencies: $(tail -1 "$log")"; }
    "$py" -c 'from accelerate.commands.config.config_args import ClusterConfig' >>"$log" 2>&1 ||
        { rm -rf "$venv"; skip "accelerate 1.5.2 does not import here: $(tail -1 "$log")"; }
fi
cd "$work" || fail "no $work"
export CTRAIN_CONFIG_FILE=$work/none.yaml
unset CTRAIN_MIXED_PRECISION CTRAIN_DEBUG CUDA_VISIBLE_DEVICES

# ---- 1. Accelerate writes, ctrain reads --------------------------------------------------
timeout 60 "$venv/bin/accelerate" config default --config_file "$work/acc_default.yaml" >/dev/null 2>&1 ||
    fail "accelerate config default failed"
"$py" - "$work" <<'EOF' || fail "Accelerate could not write its files"
import sys
from accelerate.commands.config.config_args import ClusterConfig
work = sys.argv[1]
# the documented form of `accelerate config` answers (use_cpu: the tests run on CPUs)
common = dict(compute_environment="LOCAL_MACHINE", debug=False, machine_rank=0, num_machines=1,
              main_training_function="main", rdzv_backend="static", same_network=True, downcast_bf16="no",
              tpu_env=[], tpu_use_cluster=False, tpu_use_sudo=False, enable_cpu_affinity=False, use_cpu=True,
              num_processes=2, main_process_port=0)
ClusterConfig(distributed_type="DEEPSPEED", mixed_precision="bf16",
              deepspeed_config={"gradient_accumulation_steps": 2, "offload_optimizer_device": "none",
                                "offload_param_device": "none", "zero3_init_flag": False, "zero_stage": 2},
              **common).to_yaml_file(work + "/acc_zero2.yaml")
ClusterConfig(distributed_type="DEEPSPEED", mixed_precision="fp16",
              deepspeed_config={"gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
                                "offload_optimizer_device": "cpu", "offload_param_device": "cpu",
                                "zero3_init_flag": True, "zero3_save_16bit_model": True, "zero_stage": 3},
              **common).to_yaml_file(work + "/acc_zero3.yaml")
ClusterConfig(distributed_type="FSDP", mixed_precision="no",
              fsdp_config={"fsdp_activation_checkpointing": False, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                           "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_cpu_ram_efficient_loading": True,
                           "fsdp_forward_prefetch": False, "fsdp_offload_params": False,
                           "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                           "fsdp_sync_module_states": True, "fsdp_transformer_layer_cls_to_wrap": "Block",
                           "fsdp_use_orig_params": True},
              **common).to_yaml_file(work + "/acc_fsdp.yaml")
EOF

# rank 0's variables under `ctrain launch --config_file $1`, one per line, sorted
rank0_env() {
    timeout 60 "$bin" launch --config_file "$1" sh -c \
        'env | grep -E "^(CTRAIN_(USE_|ZERO|OFFLOAD|GRADIENT|MIXED|FSDP)|WORLD_SIZE)" | sort' 2>&1 |
        sed -n 's/^\[rank0\] //p'
}
expect_env() {
    local got
    got=$(rank0_env "$1")
    [ "$got" = "$2" ] || fail "ctrain launch --config_file $1 gave rank 0
$got
expected
$2
the file:
$(cat "$1")"
}

expect_env acc_default.yaml "CTRAIN_MIXED_PRECISION=no
CTRAIN_USE_CPU=1
WORLD_SIZE=1"
echo "ok: ctrain reads accelerate config default"
expect_env acc_zero2.yaml "CTRAIN_GRADIENT_ACCUMULATION_STEPS=2
CTRAIN_MIXED_PRECISION=bf16
CTRAIN_OFFLOAD_OPTIMIZER_DEVICE=none
CTRAIN_OFFLOAD_PARAM_DEVICE=none
CTRAIN_USE_CPU=1
CTRAIN_USE_DEEPSPEED=1
CTRAIN_ZERO_STAGE=2
WORLD_SIZE=2"
expect_env acc_zero3.yaml "CTRAIN_GRADIENT_ACCUMULATION_STEPS=4
CTRAIN_GRADIENT_CLIPPING=1
CTRAIN_MIXED_PRECISION=fp16
CTRAIN_OFFLOAD_OPTIMIZER_DEVICE=cpu
CTRAIN_OFFLOAD_PARAM_DEVICE=cpu
CTRAIN_USE_CPU=1
CTRAIN_USE_DEEPSPEED=1
CTRAIN_ZERO_STAGE=3
WORLD_SIZE=2"
expect_env acc_fsdp.yaml "CTRAIN_FSDP_AUTO_WRAP_POLICY=TRANSFORMER_BASED_WRAP
CTRAIN_FSDP_BACKWARD_PREFETCH=BACKWARD_PRE
CTRAIN_FSDP_FORWARD_PREFETCH=false
CTRAIN_FSDP_OFFLOAD_PARAMS=false
CTRAIN_FSDP_SHARDING_STRATEGY=FULL_SHARD
CTRAIN_FSDP_STATE_DICT_TYPE=SHARDED_STATE_DICT
CTRAIN_FSDP_SYNC_MODULE_STATES=true
CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP=Block
CTRAIN_MIXED_PRECISION=no
CTRAIN_USE_CPU=1
CTRAIN_USE_FSDP=1
WORLD_SIZE=2"
echo "ok: ctrain reads Accelerate's DeepSpeed ZeRO-2, ZeRO-3 and FSDP FULL_SHARD files"

# ---- 2. ctrain writes, Accelerate reads ----------------------------------------------------
"$bin" config default --config_file "$work/ct_default.yaml" --mixed_precision bf16 >/dev/null ||
    fail "ctrain config default failed"
"$bin" config default --config_file "$work/ct_default.json" >/dev/null || fail "ctrain config default (json) failed"
# older forms that `ctrain config update` rewrites with ctrain's writer
cat >ct_ds.yaml <<'EOF'
distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 8
  gradient_clipping: 0.25
  offload_optimizer_device: cpu
  offload_param_device: cpu
  zero_stage: 3
mixed_precision: bf16
num_processes: 4
main_process_ip: 10.0.0.1
main_process_port: 29600
num_machines: 2
machine_rank: 1
EOF
cat >ct_fsdp.yaml <<'EOF'
distributed_type: FSDP
fp16: true
fsdp_config:
  fsdp_sharding_strategy: 4
  fsdp_backward_prefetch_policy: BACKWARD_POST
  fsdp_auto_wrap_policy: SIZE_BASED_WRAP
  fsdp_min_num_params: 2000000
  fsdp_offload_params: true
  fsdp_state_dict_type: FULL_STATE_DICT
num_processes: 2
gpu_ids: 0,1
EOF
for f in ct_ds.yaml ct_fsdp.yaml; do
    "$bin" config update --config_file "$work/$f" >/dev/null || fail "ctrain config update $f failed"
done
"$py" - "$work" <<'EOF' || fail "Accelerate disagrees with ctrain's files"
import sys
from accelerate.commands.config.config_args import load_config_from_file
work = sys.argv[1]
def check(name, want):
    c = load_config_from_file(f"{work}/{name}")
    for k, v in want.items():
        got = getattr(c, k)
        got = getattr(got, "value", got)  # enums
        if got != v:
            sys.exit(f"{name}: {k} is {got!r} in Accelerate, expected {v!r}")
check("ct_default.yaml", dict(compute_environment="LOCAL_MACHINE", distributed_type="NO", mixed_precision="bf16",
                              num_processes=1, use_cpu=True, num_machines=1, machine_rank=0, debug=False))
check("ct_default.json", dict(distributed_type="NO", mixed_precision="no", num_processes=1, use_cpu=True))
check("ct_ds.yaml", dict(distributed_type="DEEPSPEED", mixed_precision="bf16", num_processes=4, num_machines=2,
                         machine_rank=1, main_process_ip="10.0.0.1", main_process_port=29600,
                         deepspeed_config={"gradient_accumulation_steps": 8, "gradient_clipping": 0.25,
                                           "offload_optimizer_device": "cpu", "offload_param_device": "cpu",
                                           "zero3_init_flag": False, "zero_stage": 3}))
check("ct_fsdp.yaml", dict(distributed_type="FSDP", mixed_precision="fp16", num_processes=2, gpu_ids="0,1",
                           fsdp_config={"fsdp_activation_checkpointing": False,
                                        "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
                                        "fsdp_backward_prefetch": "BACKWARD_POST",
                                        "fsdp_cpu_ram_efficient_loading": True, "fsdp_forward_prefetch": False,
                                        "fsdp_min_num_params": 2000000, "fsdp_offload_params": True,
                                        "fsdp_sharding_strategy": "HYBRID_SHARD",
                                        "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_sync_module_states": True,
                                        "fsdp_use_orig_params": True}))
EOF
echo "ok: Accelerate loads ctrain's files with the same values"
