#!/usr/bin/env bash
# GPT and Llama training throughput, ctrain against PyTorch on the CPU (fp32, bf16
# autocast, and ctrain's fp8), and greedy generation with the key/value cache against
# transformers' generate, in one run.
#
#   bench/gpt_cpu/run.sh [--quick] [--out FILE] [--configs "w1 124m llama-w1"]
#                        [--threads "1 2"] [--precisions "f32 bf16 fp8"]
#                        [--generate "llama-w1 w1"] [--install]
#
# For each environment {as set: the caller's environment unchanged; unset: without
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE; only when either is set} x config {w1, 124m,
# llama-w1} x threads {1, 2} it runs
#   - the sgemm ceiling       gpt_cpu --sgemm (cblas_sgemm on the step's GEMM shapes)
#   - ctrain                  gpt_cpu (build/bench/gpt_cpu/gpt_cpu, built here first)
#   - each available torch    torch_gpt.py under every interpreter that imports a
#                             different torch (Debian's python3-torch, and a PyPI torch
#                             where some interpreter has one installed)
# each in every precision: f32, and bf16 (ctrain: gpt_cpu --precision bf16, the forward
# under CT_AUTOCAST; torch: torch.autocast("cpu", dtype=torch.bfloat16) around the
# forward), and fp8 (ctrain only: linears in fp8 with delayed scaling, the rest bf16;
# PyTorch has no fp8 training on the CPU, so its fp8 rows compare with torch bf16), with OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = threads; torch always with
# OMP_WAIT_POLICY=PASSIVE; ctrain with whichever of PASSIVE or the OpenMP default
# (OMP_WAIT_POLICY unset) was faster in a short check at the start (printed). The
# ctrain and torch runs are interleaved (ctrain, torch, ctrain, torch) and each keeps
# its best of two (one with --quick) to cut the noise of a shared VM.
#
# llama-w1 (gpt_cpu --config llama-w1; torch_llama.py: transformers' LlamaForCausalLM)
# has no sgemm ceiling and no fp8 rows. Its torch side needs transformers: each torch
# column uses its interpreter when that imports transformers, else a venv with the same
# torch that does (build/tests/venv-transformers, the tests' oracle over Debian's torch).
#
# Generation (--generate CONFIGS, default "llama-w1 w1"; "" skips it): generate_cpu
# (ct_generate, greedy, cache on) against torch_llama.py --generate (model.generate,
# do_sample=False, use_cache=True), prompt 32, 128 new tokens, batch 1, interleaved and
# best of 2 (1 with --quick) per threads value; same OMP settings as training.
#
# Interpreters: $PYTHON alone when set (it must import torch); otherwise python3 on
# PATH, /usr/bin/python3, the PyPI torch 2.x venv of bench/checkpoint/run.sh
# (build/bench/checkpoint/venv; --install creates it as that script does, with torch>=2,<3,
# accelerate>=1,<2 and transformers from PyPI: several GB, minutes) and, for a newer
# torch, any other python3 found (pyenv versions, /usr/local/bin, $VIRTUAL_ENV), one
# column per distinct torch version.
#
# Prints a markdown table (also written to FILE with --out) and the OPENBLAS_CORETYPE /
# OPENBLAS_L2_SIZE values seen. Logs of every run: build/bench/gpt_cpu/logs/.
# Exits non-zero, with a message, when any run fails or a first-step loss is not close
# to ln(vocab) (the sanity check that both sides train the same model).
set -euo pipefail

die() { echo "run.sh: $*" >&2; exit 1; }
trap 'echo "run.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

quick=0
out=""
configs="w1 124m llama-w1"
thread_list="1 2"
precisions="f32 bf16 fp8"
gen_configs="llama-w1 w1"
install=0
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --out) [ $# -ge 2 ] || die "--out needs a file name"; out=$2; shift ;;
    --configs) [ $# -ge 2 ] || die "--configs needs a list, e.g. \"w1 124m\""; configs=$2; shift ;;
    --threads) [ $# -ge 2 ] || die "--threads needs a list, e.g. \"1 2\""; thread_list=$2; shift ;;
    --precisions) [ $# -ge 2 ] || die "--precisions needs a list, e.g. \"f32 bf16\""; precisions=$2; shift ;;
    --generate) [ $# -ge 2 ] || die "--generate needs a list, e.g. \"llama-w1 w1\" (or \"\")"; gen_configs=$2; shift ;;
    --install) install=1 ;;
    -h | --help) sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
for c in $configs; do
    case "$c" in w1 | 124m | llama-w1) ;; *) die "--configs: unknown config '$c' (w1, 124m, llama-w1)" ;; esac
done
for c in $gen_configs; do
    case "$c" in w1 | llama-w1) ;; *) die "--generate: unknown config '$c' (llama-w1, w1)" ;; esac
done
for t in $thread_list; do
    [[ "$t" =~ ^[1-9][0-9]*$ ]] || die "--threads: '$t' is not a positive integer"
done
for p in $precisions; do
    case "$p" in f32 | bf16 | fp8) ;; *) die "--precisions: unknown precision '$p' (f32, bf16, fp8)" ;; esac
done
[ -z "$out" ] || : >"$out" || die "cannot write --out $out"

# ---- steps ----------------------------------------------------------------------------
if [ "$quick" = 1 ]; then
    reps=1
    steps_w1="--warmup 1 --steps 2"
    steps_124m="--warmup 1 --steps 1"
    steps_sgemm="--warmup 1 --steps 2"
    steps_check="--warmup 1 --steps 1"
else
    reps=2
    steps_w1="" # the programs' defaults: w1 3 + 20, 124m 2 + 6
    steps_124m=""
    steps_sgemm="--warmup 3 --steps 10"
    steps_check="--warmup 1 --steps 3"
fi
steps_for() { if [ "$1" = 124m ]; then echo "$steps_124m"; else echo "$steps_w1"; fi; }
gen_reps=$([ "$quick" = 1 ] && echo "--reps 1" || echo "--reps 3")

# ---- build ----------------------------------------------------------------------------
bin=build/bench/gpt_cpu/gpt_cpu
gen_bin=build/bench/gpt_cpu/generate_cpu
echo "run.sh: building $bin $gen_bin" >&2
make -s "$bin" "$gen_bin" >&2 || die "make $bin $gen_bin failed"
for b in "$bin" "$gen_bin"; do [ -x "$b" ] || die "$b was not built"; done
logs=build/bench/gpt_cpu/logs
rm -rf "$logs"
mkdir -p "$logs"
results=$logs/results.tsv
: >"$results"

# ---- interpreters with torch ----------------------------------------------------------
# The PyPI torch 2.x venv that bench/checkpoint/run.sh makes (same place, same specs)
torch2_venv=build/bench/checkpoint/venv
if [ "$install" = 1 ] && ! "$torch2_venv/bin/python3" -c 'import torch, transformers' 2>/dev/null; then
    ilog=build/bench/gpt_cpu/install.log
    mkdir -p build/bench/gpt_cpu
    echo "run.sh: installing torch>=2,<3, accelerate, transformers from PyPI into $torch2_venv (log: $ilog; minutes)" >&2
    { [ -x "$torch2_venv/bin/python3" ] || timeout 300 "${PYTHON:-/usr/bin/python3}" -m venv "$torch2_venv"; } >"$ilog" 2>&1 &&
        timeout 1800 "$torch2_venv/bin/python3" -m pip install "${TORCH_SPEC:-torch>=2,<3}" \
            "${ACCELERATE_SPEC:-accelerate>=1,<2}" "${TRANSFORMERS_SPEC:-transformers}" >>"$ilog" 2>&1 ||
        echo "run.sh: the install failed (see $ilog); going on with the torch found" >&2
fi
torch_version() { "$1" -c 'import torch, sys; sys.stdout.write(torch.__version__)' 2>/dev/null; }
pys=()
vers=()
add_python() {
    local p v i
    p=$(command -v "$1" 2>/dev/null) || return 0
    v=$(torch_version "$p") || return 0
    [ -n "$v" ] || return 0
    for i in "${vers[@]+"${vers[@]}"}"; do [ "$i" = "$v" ] && return 0; done
    pys+=("$p")
    vers+=("$v")
}
if [ -n "${PYTHON:-}" ]; then
    v=$(torch_version "$PYTHON") || die "\$PYTHON=$PYTHON cannot import torch"
    pys=("$PYTHON")
    vers=("$v")
else
    add_python python3
    add_python /usr/bin/python3
    add_python "$torch2_venv/bin/python3"
    for p in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python3"} /usr/local/bin/python3 \
        "$HOME"/.pyenv/versions/*/bin/python3 $(compgen -c python3. 2>/dev/null | sort -u); do
        [ -e "$p" ] || command -v "$p" >/dev/null 2>&1 || continue
        add_python "$p"
    done
fi
[ ${#pys[@]} -gt 0 ] || die "no interpreter can import torch (tried python3, /usr/bin/python3, others; set \$PYTHON)"
for i in "${!pys[@]}"; do echo "run.sh: torch ${vers[$i]} via ${pys[$i]}" >&2; done
py=${pys[0]} # any of them has json for the report
# For torch_llama.py: each column's interpreter if it imports transformers, else a venv
# over the same torch that does ("" = no Llama or generation rows for that torch).
tf_pys=()
for i in "${!pys[@]}"; do
    tf=""
    for p in "${pys[$i]}" build/tests/venv-transformers/bin/python; do
        [ -x "$p" ] || command -v "$p" >/dev/null 2>&1 || continue
        [ "$(torch_version "$p")" = "${vers[$i]}" ] || continue
        "$p" -c 'import transformers' 2>/dev/null || continue
        tf=$p
        break
    done
    tf_pys+=("$tf")
    echo "run.sh: torch ${vers[$i]}: transformers via ${tf:-<none: no Llama or generation rows>}" >&2
done

coretype=${OPENBLAS_CORETYPE-<unset>}
l2size=${OPENBLAS_L2_SIZE-<unset>}

# ---- one run ---------------------------------------------------------------------------
# run ENVNAME THREADS WAITPOLICY(default|PASSIVE) LOGNAME CMD... ; appends "ENVNAME\tJSON" to results
n_run=0
run() {
    local envname=$1 t=$2 wait=$3 log=$4
    shift 4
    local -a e=(env)
    [ "$envname" = unset ] && e+=(-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
    if [ "$wait" = PASSIVE ]; then e+=(OMP_WAIT_POLICY=PASSIVE); else e=("${e[@]:0:1}" -u OMP_WAIT_POLICY "${e[@]:1}"); fi
    e+=(OPENBLAS_NUM_THREADS="$t" OMP_NUM_THREADS="$t")
    n_run=$((n_run + 1))
    local f
    f="$logs/$(printf %03d $n_run)-$log"
    echo "run.sh: [$envname] ${e[*]} $*" >"$f.err"
    if ! "${e[@]}" "$@" >"$f.out" 2>>"$f.err"; then
        echo "run.sh: FAILED ($envname, OMP_WAIT_POLICY=$wait, threads $t): $*" >&2
        tail -n 20 "$f.err" >&2
        exit 1
    fi
    local line
    line=$(grep '^{' "$f.out" | tail -n 1) || die "no JSON line from: $* (see $f.out)"
    printf '%s\t%s\t%s\n' "$envname" "$wait" "$line" >>"$results"
    echo "run.sh: [$envname t=$t] $line" >&2
    LAST_JSON=$line
}
tok_s() { "$py" -c 'import json,sys; print(json.loads(sys.argv[1])["tokens_per_s"])' "$1"; }

# ---- ctrain's OMP_WAIT_POLICY ----------------------------------------------------------
max_t=1
for t in $thread_list; do [ "$t" -gt "$max_t" ] && max_t=$t; done
first_cfg=w1 # the cheaper model, whatever --configs says
best_default=0
best_passive=0
for r in 1 2; do
    for w in default PASSIVE; do
        # shellcheck disable=SC2086
        run check "$max_t" "$w" "waitcheck-$w" "$bin" --config "$first_cfg" --threads "$max_t" $steps_check
        v=$(tok_s "$LAST_JSON")
        if [ "$w" = PASSIVE ]; then
            best_passive=$("$py" -c "print(max($best_passive, $v))")
        else
            best_default=$("$py" -c "print(max($best_default, $v))")
        fi
    done
done
if "$py" -c "import sys; sys.exit(0 if $best_passive > $best_default else 1)"; then ctrain_wait=PASSIVE; else ctrain_wait=default; fi
wait_note="ctrain OMP_WAIT_POLICY check ($first_cfg, $max_t threads, best of 2): unset $best_default tok/s, PASSIVE $best_passive tok/s -> ctrain runs with $([ $ctrain_wait = PASSIVE ] && echo OMP_WAIT_POLICY=PASSIVE || echo OMP_WAIT_POLICY unset)"
echo "run.sh: $wait_note" >&2

# ---- the grid --------------------------------------------------------------------------
envnames=("as set")
[ -z "${OPENBLAS_CORETYPE+x}${OPENBLAS_L2_SIZE+x}" ] || envnames+=(unset) # else "unset" is the same run
for envname in "${envnames[@]}"; do
    envkey=$([ "$envname" = unset ] && echo unset || echo as_set)
    for cfg in $configs; do
        for t in $thread_list; do
            # shellcheck disable=SC2086
            [ "$cfg" = llama-w1 ] ||
                run "$envkey" "$t" PASSIVE "sgemm-$cfg-$t" "$bin" --config "$cfg" --threads "$t" --sgemm $steps_sgemm
            for prec in $precisions; do
                [ "$cfg" != llama-w1 ] || [ "$prec" != fp8 ] || continue # GPT only
                for r in $(seq 1 $reps); do
                    # shellcheck disable=SC2046
                    run "$envkey" "$t" "$ctrain_wait" "ctrain-$cfg-$t-$prec-$r" "$bin" --config "$cfg" --threads "$t" \
                        --precision "$prec" $(steps_for "$cfg")
                    [ "$prec" != fp8 ] || continue # no torch fp8 training on the CPU
                    for i in "${!pys[@]}"; do
                        tp=${pys[$i]} script=torch_gpt.py
                        [ "$cfg" != llama-w1 ] || tp=${tf_pys[$i]} script=torch_llama.py
                        [ -n "$tp" ] || continue
                        # shellcheck disable=SC2046
                        run "$envkey" "$t" PASSIVE "torch${i}-$cfg-$t-$prec-$r" "$tp" "$here/$script" \
                            --config "$cfg" --threads "$t" --precision "$prec" $(steps_for "$cfg")
                    done
                done
            done
        done
    done
done

# ---- generation -----------------------------------------------------------------------
gen_results=$logs/generate.tsv
: >"$gen_results"
for cfg in $gen_configs; do
    for t in $thread_list; do
        for r in $(seq 1 $reps); do
            # shellcheck disable=SC2086
            run gen "$t" "$ctrain_wait" "gen-ctrain-$cfg-$t-$r" "$gen_bin" --config "$cfg" --threads "$t" $gen_reps
            printf '%s\n' "$LAST_JSON" >>"$gen_results"
            for i in "${!pys[@]}"; do
                [ -n "${tf_pys[$i]}" ] || continue
                # shellcheck disable=SC2086
                run gen "$t" PASSIVE "gen-torch${i}-$cfg-$t-$r" "${tf_pys[$i]}" "$here/torch_llama.py" --generate \
                    --config "$cfg" --threads "$t" $gen_reps
                printf '%s\n' "$LAST_JSON" >>"$gen_results"
            done
        done
    done
done

# ---- report ----------------------------------------------------------------------------
report=$logs/table.md
"$py" - "$results" "$coretype" "$l2size" "$wait_note" "$quick" >"$report" <<'EOF' || die "the report failed (loss check or parsing; see above)"
import json, math, sys

path, coretype, l2size, wait_note, quick = sys.argv[1:6]
rows = []
with open(path) as f:
    for line in f:
        env, wait, js = line.rstrip("\n").split("\t", 2)
        if env in ("check", "gen"):
            continue
        d = json.loads(js)
        d["env"] = "as set" if env == "as_set" else "unset"
        rows.append(d)

vocab = {"w1": 256, "124m": 50257, "llama-w1": 2048}
bad = [r for r in rows if r["loss0"] is not None and abs(r["loss0"] - math.log(vocab[r["config"]])) > 0.5]
for r in bad:
    print(f"run.sh: loss0 {r['loss0']} of {r['impl']} ({r['config']}, {r['env']}) is not near "
          f"ln({vocab[r['config']]}) = {math.log(vocab[r['config']]):.3f}", file=sys.stderr)
if bad:
    sys.exit(1)

best = {}  # (env, config, threads, impl, precision) -> the run with the most tokens/s
for r in rows:
    r.setdefault("precision", "f32")  # the sgemm ceiling's rows
    k = (r["env"], r["config"], r["threads"], r["impl"], r["precision"])
    if k not in best or r["tokens_per_s"] > best[k]["tokens_per_s"]:
        best[k] = r
torches = []
for r in rows:
    if r["impl"].startswith("torch-") and r["impl"] not in torches:
        torches.append(r["impl"])

def f(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"

print(f"OPENBLAS_CORETYPE as set: {coretype}; OPENBLAS_L2_SIZE as set: {l2size}"
      " (\"unset\" rows run without both)")
print(wait_note)
adamw = sorted({f"{r['impl']}: {r['adamw']}" for r in rows if "adamw" in r})
print("torch AdamW implementation (fastest in its pre-check): " + "; ".join(adamw))
print("steps: " + ("--quick (smoke test, not a measurement)" if quick == "1" else
      "w1 3 warm-up + 20 timed, 124m 2 + 6; median step; best of 2 interleaved runs"))
print()
print("| env | config | threads | precision | torch | ctrain tok/s | torch tok/s | ctrain/torch | ctrain GFLOP/s "
      "| torch GFLOP/s | sgemm ceiling GFLOP/s | ctrain % of ceiling | ctrain peak RSS MiB "
      "| torch peak RSS MiB | loss0 ctrain / torch |")
print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
seen = []
for r in rows:
    k = (r["env"], r["config"], r["threads"])
    if k not in seen:
        seen.append(k)
precs = [p for p in ("f32", "bf16") if any(r["precision"] == p and r["impl"] == "ctrain" for r in rows)]
for env, cfg, t in seen:
    s = best.get((env, cfg, t, "sgemm", "f32"))
    for prec in precs:
        c = best.get((env, cfg, t, "ctrain", prec))
        for tv in torches:
            p = best.get((env, cfg, t, tv, prec))
            if not (c and p):
                continue
            # the f32 sgemm ceiling bounds the f32 rows only (none for llama-w1)
            ceil = f"{100 * c['gflops'] / s['gflops']:.0f}%" if prec == "f32" and s else "-"
            print(f"| {env} | {cfg} | {t} | {prec} | {tv[6:]} | {f(c['tokens_per_s'], 0)} | {f(p['tokens_per_s'], 0)} "
                  f"| {c['tokens_per_s'] / p['tokens_per_s']:.2f} | {f(c['gflops'])} | {f(p['gflops'])} "
                  f"| {f(s['gflops']) if s else '-'} | {ceil} | {f(c['peak_rss_mb'], 0)} "
                  f"| {f(p['peak_rss_mb'], 0)} | {c['loss0']:.3f} / {p['loss0']:.3f} |")
if "bf16" in precs and "f32" in precs:
    print()
    print("bf16 against f32 (best runs): ctrain bf16 / ctrain f32, ctrain bf16 / torch autocast bf16")
    print()
    print("| env | config | threads | ctrain bf16 tok/s | ctrain f32 tok/s | bf16 / f32 | torch bf16 tok/s "
          "| ctrain bf16 / torch bf16 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for env, cfg, t in seen:
        cb, cf = best.get((env, cfg, t, "ctrain", "bf16")), best.get((env, cfg, t, "ctrain", "f32"))
        for tv in torches:
            pb = best.get((env, cfg, t, tv, "bf16"))
            if cb and cf and pb:
                print(f"| {env} | {cfg} | {t} | {f(cb['tokens_per_s'], 0)} | {f(cf['tokens_per_s'], 0)} "
                      f"| {cb['tokens_per_s'] / cf['tokens_per_s']:.2f} | {f(pb['tokens_per_s'], 0)} "
                      f"| {cb['tokens_per_s'] / pb['tokens_per_s']:.2f} |")
if "fp8" in [r["precision"] for r in rows if r["impl"] == "ctrain"]:
    print()
    print("fp8 (best runs; ctrain only: linears in fp8 with delayed scaling, the rest bf16): "
          "against ctrain f32 and bf16, and torch autocast bf16")
    print()
    print("| env | config | threads | ctrain fp8 tok/s | fp8 / ctrain f32 | fp8 / ctrain bf16 | torch | fp8 / torch bf16 "
          "| ctrain fp8 peak RSS MiB | loss0 |")
    print("|---|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for env, cfg, t in seen:
        c8 = best.get((env, cfg, t, "ctrain", "fp8"))
        if not c8:
            continue
        cf, cb = best.get((env, cfg, t, "ctrain", "f32")), best.get((env, cfg, t, "ctrain", "bf16"))
        for tv in torches or [None]:
            pb = best.get((env, cfg, t, tv, "bf16")) if tv else None
            ratio = lambda o: "-" if not o else f"{c8['tokens_per_s'] / o['tokens_per_s']:.2f}"
            print(f"| {env} | {cfg} | {t} | {f(c8['tokens_per_s'], 0)} | {ratio(cf)} | {ratio(cb)} "
                  f"| {tv[6:] if tv else '-'} | {ratio(pb)} | {f(c8['peak_rss_mb'], 0)} | {c8['loss0']:.3f} |")
EOF
if [ -s "$gen_results" ]; then
    "$py" - "$gen_results" >>"$report" <<'EOF' || die "the generation report failed"
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = {}  # (config, threads, impl) -> the run with the most tokens/s
for r in rows:
    k = (r["config"], r["threads"], r["impl"])
    if k not in best or r["tokens_per_s"] > best[k]["tokens_per_s"]:
        best[k] = r
print()
print(f"Generation, batch 1, prompt {rows[0]['prompt']}, {rows[0]['new_tokens']} new tokens, greedy, key/value "
      "cache on (ctrain ct_generate; torch: transformers model.generate); median of the timed generations, "
      "best of the interleaved runs. tok/s = new tokens / the whole call; decode = tokens after the first / "
      "their time; prefill = time to the first token")
print()
print("| config | threads | impl | tok/s | decode tok/s | prefill ms | peak RSS MiB | ctrain / this |")
print("|---|---:|---|---:|---:|---:|---:|---:|")
for (cfg, t, impl), r in best.items():
    c = best.get((cfg, t, "ctrain"))
    ratio = "-" if impl == "ctrain" or not c else f"{c['tokens_per_s'] / r['tokens_per_s']:.2f}"
    name = impl if impl == "ctrain" else f"{impl} (transformers {r.get('transformers', '?')})"
    print(f"| {cfg} | {t} | {name} | {r['tokens_per_s']:.0f} | {r['decode_tok_s']:.0f} | {r['prefill_ms']:.1f} "
          f"| {r['peak_rss_mb']:.0f} | {ratio} |")
EOF
fi
cat "$report"
[ -z "$out" ] || cp "$report" "$out"
echo "run.sh: logs in $logs" >&2
