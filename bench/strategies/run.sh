#!/usr/bin/env bash
# GPT training under each sharding strategy on this machine: tokens/s, per-rank memory by
# what it holds, and bytes on the wire, DDP beside ZeRO-1, ZeRO-2, ZeRO-3 and HYBRID.
# The measuring is `ctrain bench` (docs/launch.md, "ctrain bench"); this script runs
# the grid of bench/README.md's table with it and collects the tables.
#
#   bench/strategies/run.sh [--quick] [--configs LIST] [--ranks LIST] [--precisions LIST]
#                           [--strategies LIST] [--layouts LIST] [--micro_batches M]
#                           [--out FILE] [--timeout S]
#
# One `ctrain bench` per config, each running every cell of ranks x precisions x
# strategies (OMP_WAIT_POLICY and CTRAIN_TRANSPORT unset: shared memory between the
# ranks; 1 thread per rank):
#   configs     w1 (vocab 256, 4 layers, 4 heads, width 256; 3.2M parameters) and
#               wide (vocab 256, 12 layers, 12 heads, width 768; 85M parameters)
#   ranks       2 and 4
#   precisions  f32 and bf16 (DDP: autocast over f32 parameters; the sharded strategies:
#               16-bit parameters and gradients beside f32 master slices)
#   strategies  ddp, zero1, zero2, zero3, hybrid (ZeRO-3 inside groups of N/2 ranks,
#               replicated across the 2 groups); also zero2_offload, zero3_offload
#   LISTs are comma-separated; default all of them (the offload variants left out).
# Then the model-parallel layouts, per config one more `ctrain bench` on 4 ranks in f32
# (--layouts LIST, default ddp,tp2dp2,tp2sp,pp2dp2,tp2pp2,tp4,pp4; --layouts none skips them;
# --micro_batches M for the pipelines, default 4): Megatron-LM tensor parallelism
# (tp2sp: with sequence parallelism), 1F1B pipelines and both (tp2pp2), all through the
# Accelerator, dp = 4 / (tp pp) replicas,
# with the bytes sent per axis and the pipeline bubble beside (pp-1)/(M+pp-1); about 3
# more minutes on 2 cores.
# Steps (per rank, per step: B rows of T tokens; the same random tokens and initial
# weights under every strategy):
#   w1    T 64, B 4, 2 warm-up + 10 timed steps    (--quick: 1 + 2)
#   wide  T 64, B 2, 1 warm-up + 3 timed steps     (--quick: 1 + 1)
# so that all 80 cells take about 15 minutes on 2 cores. --quick is a smoke test, not
# a measurement.
#
# Output: per config, build/bench/strategies/CONFIG/ and CONFIG-layouts/ (results.csv,
# strategies.png with gnuplot, logs/: ctrain bench's output); the markdown tables on stdout (also written to
# FILE with --out). Every run is bounded by --timeout seconds (default 600, 180 with
# --quick). A run that fails is a row "failed: <the rank's message>" and the others
# still run; a first loss not near ln 256, or an f32 loss away from DDP's, is listed
# under its table; either makes the script exit non-zero.
# shellcheck source=bench/run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../run_lib.sh"

quick=0
out=""
limit=""
configs=w1,wide
ranks=2,4
precisions=f32,bf16
strategies=ddp,zero1,zero2,zero3,hybrid
layouts=ddp,tp2dp2,tp2sp,pp2dp2,tp2pp2,tp4,pp4
micro=4
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --configs) [ $# -ge 2 ] || die "--configs needs a list (w1,wide)"; configs=$2; shift ;;
    --ranks) [ $# -ge 2 ] || die "--ranks needs a list (2,4)"; ranks=$2; shift ;;
    --precisions) [ $# -ge 2 ] || die "--precisions needs a list (f32,bf16)"; precisions=$2; shift ;;
    --strategies) [ $# -ge 2 ] || die "--strategies needs a list (ddp,zero1,zero2,zero3,hybrid)"
        strategies=$2; shift ;;
    --layouts) [ $# -ge 2 ] || die "--layouts needs a list (ddp,tp2dp2,...) or none"; layouts=$2; shift ;;
    --micro_batches) [ $# -ge 2 ] || die "--micro_batches needs a number"; micro=$2; shift ;;
    --out) [ $# -ge 2 ] || die "--out needs a file name"; out=$2; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; limit=$2; shift ;;
    -h | --help) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
IFS=, read -r -a config_list <<<"$configs"
[ ${#config_list[@]} -gt 0 ] || die "--configs: empty list; expected w1 and/or wide"
for c in "${config_list[@]}"; do [[ "$c" =~ ^(w1|wide)$ ]] || die "--configs: '$c' is not w1 or wide"; done
# ctrain bench names f32 "no" (accelerate's mixed_precision); it checks every other name
IFS=, read -r -a prec_list <<<"$precisions"
for i in "${!prec_list[@]}"; do [ "${prec_list[$i]}" != f32 ] || prec_list[i]=no; done
precisions=$(IFS=,; echo "${prec_list[*]}")
[ -n "$limit" ] || limit=$([ "$quick" = 1 ] && echo 180 || echo 600)
case "$out" in "" | /*) ;; *) out=$start_dir/$out ;; esac # relative to where it was called from
[ -z "$out" ] || { mkdir -p "$(dirname "$out")" && : >"$out"; } || die "cannot write --out $out"

# per config: tokens per row, rows per rank, warm-up and timed steps
cell_args() {
    case "$1,$quick" in
    w1,0) echo "--seq_len 64 --batch_size 4 --warmup_steps 2 --steps 10" ;;
    w1,1) echo "--seq_len 64 --batch_size 4 --warmup_steps 1 --steps 2" ;;
    wide,0) echo "--seq_len 64 --batch_size 2 --warmup_steps 1 --steps 3" ;;
    wide,1) echo "--seq_len 64 --batch_size 2 --warmup_steps 1 --steps 1" ;;
    esac
}

ctrain=build/bin/ctrain
echo "run.sh: building $ctrain" >&2
make -s "$ctrain" >&2 || die "make $ctrain failed"
[ -x "$ctrain" ] || die "$ctrain was not built"

dir=build/bench/strategies
logs=$dir/logs
mkdir -p "$logs"
report=$logs/table.md
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
{
    echo "GPT training by sharding strategy, $(nproc) CPUs (${cpu:-unknown CPU}); $("$ctrain" --version)"
    echo "method: $([ "$quick" = 1 ] && echo "--quick (a smoke test, not a measurement)" || echo "one run per cell")"
} >"$report"
# run_logged bounds the whole grid of a config: every run at its --timeout, and a minute
ncells=$(($(tr -cd , <<<"$ranks" | wc -c) + 1))
ncells=$((ncells * ($(tr -cd , <<<"$precisions" | wc -c) + 1) * ($(tr -cd , <<<"$strategies" | wc -c) + 1)))
per_run=$limit
limit=$((ncells * per_run + 60))
status=0
for c in "${config_list[@]}"; do
    # shellcheck disable=SC2046 # cell_args is a list of flags
    run_logged "$c" env -u OMP_WAIT_POLICY -u CTRAIN_TRANSPORT "$ctrain" bench --model "gpt:$c" \
        --num_processes "$ranks" --mixed_precision "$precisions" --strategies "$strategies" \
        --num_cpu_threads_per_process 1 --timeout "$per_run" --output_dir "$dir/$c" $(cell_args "$c")
    [ "$rc" -eq 0 ] || status=1
    [ "$rc" -ne 2 ] || die "ctrain bench refused its flags: $(tail -n 1 "$logs/$c.err")"
    # the table, its notes and checks: from the model's line to the files written
    sed -n '/^gpt:.* parameters, /,/^wrote /p' "$logs/$c.out" | sed '$d' >>"$report"
    sed -n 's/^\(wrote\|gnuplot\|no run\)/run.sh: \1/p' "$logs/$c.out" >&2
    [ "$layouts" != none ] || continue
    # the layouts: 4 ranks, f32 (the loss check against DDP needs f32)
    nlayouts=$(($(tr -cd , <<<"$layouts" | wc -c) + 1))
    limit=$((nlayouts * per_run + 60))
    # shellcheck disable=SC2046 # cell_args is a list of flags
    run_logged "$c-layouts" env -u OMP_WAIT_POLICY -u CTRAIN_TRANSPORT "$ctrain" bench --model "gpt:$c" \
        --num_processes 4 --mixed_precision no --strategies "$layouts" --num_micro_batches "$micro" \
        --num_cpu_threads_per_process 1 --timeout "$per_run" --output_dir "$dir/$c-layouts" $(cell_args "$c")
    [ "$rc" -eq 0 ] || status=1
    [ "$rc" -ne 2 ] || die "ctrain bench refused its flags: $(tail -n 1 "$logs/$c-layouts.err")"
    sed -n '/^gpt:.* parameters, /,/^wrote /p' "$logs/$c-layouts.out" | sed '$d' >>"$report"
    limit=$((ncells * per_run + 60))
done
cat "$report"
[ -z "$out" ] || cp "$report" "$out"
echo "run.sh: results in $dir/CONFIG/results.csv; logs in $logs and $dir/CONFIG/logs" >&2
[ "$status" -eq 0 ] || echo "run.sh: a run or a check failed (see the tables)" >&2
exit "$status"
