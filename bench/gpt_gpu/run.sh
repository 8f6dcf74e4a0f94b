#!/usr/bin/env bash
# GPT-2 124M training on one GPU: ctrain beside PyTorch (eager and torch.compile), and
# each ctrain kernel's achieved rate against the device's peak, in one run.
#
#   bench/gpt_gpu/run.sh [--out FILE] [--install-torch] [--steps N]
#
# Runs, on cuda:0, each with bf16 autocast, batch 16 x 1024, AdamW, 3 warm-up steps and
# N timed steps (default 10; the median is reported):
#   - ctrain            build/bench/gpt_gpu/gpt_gpu (built here first)
#   - torch eager       bench/gpt_cpu/torch_gpt.py --config 124m-gpu --device cuda
#   - torch.compile     the same with --compile
#   - ctrain kernels    gpt_gpu --kernels (TFLOP/s or GB/s beside the peak)
# PyTorch: $PYTHON when set, else the first python3 (PATH, /usr/bin) whose torch sees a
# GPU; --install-torch first makes build/bench/gpt_gpu/venv with PyPI's torch (needs the
# network). Without one, the torch rows say why and the ctrain rows still run.
#
# Prints a markdown table (also written to FILE with --out). Logs: build/bench/gpt_gpu/logs/.
# Exits 3 when no GPU can be used (the reason printed), non-zero on any failed run.
# shellcheck source=bench/run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../run_lib.sh"

out="" install=0 steps=10
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=$2; shift 2 ;;
    --install-torch) install=1; shift ;;
    --steps) steps=$2; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || die "--steps $steps: expected a positive integer"
case "$out" in /*) ;; "") ;; *) out="$start_dir/$out" ;; esac

work=build/bench/gpt_gpu
logs=$work/logs
limit=900
mkdir -p "$logs"
make --no-print-directory build/bench/gpt_gpu/gpt_gpu >"$logs/build.log" 2>&1 || { tail -20 "$logs/build.log"; die "build failed"; }

# ---- the interpreter for the torch rows -------------------------------------------------
torch_ok() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if [ "$install" = 1 ] && [ -z "${PYTHON:-}" ]; then
    if [ ! -x "$work/venv/bin/python" ]; then
        python3 -m venv "$work/venv" && "$work/venv/bin/pip" install -q torch >"$logs/pip.log" 2>&1 ||
            echo "run.sh: could not install torch from PyPI (see $logs/pip.log)" >&2
    fi
    [ -x "$work/venv/bin/python" ] && PYTHON=$work/venv/bin/python
fi
py="" why="no python3 on this machine imports a torch that sees the GPU (--install-torch, or PYTHON=...)"
for cand in ${PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && torch_ok "$cand"; then py=$cand; why=""; break; fi
done
[ -n "${PYTHON:-}" ] && [ -z "$py" ] && why="PYTHON=$PYTHON does not import a torch that sees the GPU"

# ---- runs --------------------------------------------------------------------------
run_logged ctrain "$work/gpt_gpu" --steps "$steps"
[ "$rc" -eq 3 ] && { cat "$logs/ctrain.err" >&2; exit 3; }
[ "$rc" -eq 0 ] || die "ctrain failed (exit $rc)"
ctrain_json=$(tail -1 "$logs/ctrain.out")
run_logged kernels "$work/gpt_gpu" --kernels
[ "$rc" -eq 0 ] || die "ctrain --kernels failed (exit $rc)"
eager_json="" compile_json=""
if [ -n "$py" ]; then
    run_logged torch_eager "$py" bench/gpt_cpu/torch_gpt.py --config 124m-gpu --threads 1 --device cuda \
        --precision bf16 --steps "$steps"
    [ "$rc" -eq 0 ] && eager_json=$(tail -1 "$logs/torch_eager.out")
    run_logged torch_compile "$py" bench/gpt_cpu/torch_gpt.py --config 124m-gpu --threads 1 --device cuda \
        --precision bf16 --steps "$steps" --compile
    [ "$rc" -eq 0 ] && compile_json=$(tail -1 "$logs/torch_compile.out")
fi

# ---- the table ------------------------------------------------------------------------
python3 - "$ctrain_json" "$eager_json" "$compile_json" "$why" "$logs/kernels.out" >"$work/table.md" <<'EOF'
import json, sys
c = json.loads(sys.argv[1])
e = json.loads(sys.argv[2]) if sys.argv[2] else None
k = json.loads(sys.argv[3]) if sys.argv[3] else None
why = sys.argv[4]
print(f"GPT-2 124M training on {c['gpu']}: bf16 autocast, batch {c['batch']} x {c['seq']}, AdamW, median step")
print()
print("| implementation | tokens/s | step ms | TFLOP/s | MFU | ctrain / this |")
print("|---|---:|---:|---:|---:|---:|")
mfu = lambda r: f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "?"
print(f"| ctrain | {c['tokens_per_s']:.0f} | {c['step_ms']:.1f} | {c['tflops']:.1f} | {mfu(c)} | 1.00 |")
for name, r in (("PyTorch eager", e), ("PyTorch torch.compile", k)):
    if r:
        flops = r["gflops"] / 1e3
        print(f"| {name} ({r['impl']}) | {r['tokens_per_s']:.0f} | {r['step_ms']:.1f} | {flops:.1f} | "
              f"{100 * flops / (c['tflops'] / c['mfu']):.1f}% | {c['tokens_per_s'] / r['tokens_per_s']:.2f} |"
              if c.get("mfu") else
              f"| {name} ({r['impl']}) | {r['tokens_per_s']:.0f} | {r['step_ms']:.1f} | {flops:.1f} | ? | "
              f"{c['tokens_per_s'] / r['tokens_per_s']:.2f} |")
    else:
        print(f"| {name} | not run: {why or 'the run failed (see the logs)'} | | | | |")
print()
print(f"ctrain peak memory: {c['peak_allocated_gib']:.1f} GiB allocated, {c['peak_reserved_gib']:.1f} GiB reserved.")
print()
print("| kernel | shape | ms | achieved | peak | fraction |")
print("|---|---|---:|---:|---:|---:|")
for line in open(sys.argv[5]):
    r = json.loads(line)
    unit = "TFLOP/s" if "tflops" in r else "GB/s"
    v = r.get("tflops", r.get("gbps"))
    print(f"| {r['kernel']} | {r['shape']} | {r['ms']:.3f} | {v:.1f} {unit} | {r['peak']:.0f} {unit} | "
          f"{100 * r['fraction']:.0f}% |")
EOF
cat "$work/table.md"
[ -n "$out" ] && cp "$work/table.md" "$out"
exit 0
