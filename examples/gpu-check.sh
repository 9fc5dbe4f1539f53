#!/usr/bin/env bash
# The GPU check: our nanoGPT through LibTorch's CUDA and through Vulkan, and the original EXO
# Gym (Python, PyTorch) on the same GPU with the same configurations, side by side.
#
#   bash examples/gpu-check.sh --prepare         # here, before a GPU is lent: fills target/gpu-check
#   bash examples/gpu-check.sh OUTDIR            # on the lent GPU machine, from the repository root
#   bash examples/gpu-check.sh --cpu OUTDIR      # the same runs, small, on this machine's CPU
#
# --prepare gathers what the lent machine lacks. It has Python 3 with torch 2.11.0+cu130 (and
# numpy, einops, tqdm, psutil), no cargo and no internet; the device tool carries 64 MiB:
#   target/gpu-check/bin/nanogpt-tch        our nanoGPT with --features tch, linked against
#                                           PyPI's torch 2.11.0 (bash examples/scripts/install-
#                                           libtorch.sh; its env.sh set for the build), stripped:
#                                           it runs there on that machine's own torch libraries
#   target/gpu-check/bin/nanogpt-vulkan.xz  the same with --features vulkan, if built
#                                           (target/vulkan), compressed; and Debian's Vulkan
#                                           loader beside it (lib/), if installed here
#   target/gpu-check/original-gym/          the original's source ($ORIGINAL_GYM_DIR), with COMMIT
#   target/gpu-check/data/shakespeare/      tiny-shakespeare ($GYM_DATA_DIR or ../shared/data)
#
# On the device tool (one call, within 8 minutes):
#   run(command='bash examples/gpu-check.sh "$OUT"', carry=["target/gpu-check"], timeout_s=560)
#
# It writes OUTDIR/gpu-check.json, one JSON object a line (impl "ours" or "original",
# backend, model, params, nodes, strategy, steps, tokens_per_s, final_train_loss, and more),
# each run's output under OUTDIR/runs/, and prints the table with ours ÷ original. Runs go
# in order of importance (LibTorch CUDA, the original, the CPU curve, Vulkan); one that
# fails or passes its time limit is reported and the check goes on; once the time budget
# (GPU_CHECK_BUDGET_S, default 450 s) is spent, the remaining runs are skipped.
#
# Every run of a configuration starts from the same seed. Ours draws the initial weights
# on the host and moves them to the device, so each backend starts from the same model and
# the CPU run's curve (flex) is the reference the GPU's is compared with (`curve` lines:
# the largest relative gap between the two runs' training losses, step by step).
#
# Environment: PYTHON (default python3), a Python with torch for the original and for the
# LibTorch binary's libraries; GPU_CHECK_STEPS to override every run's steps.
set -uo pipefail
cd "$(dirname "$0")/.."
here="$(pwd)"
carry="$here/target/gpu-check"
PYTHON="${PYTHON:-python3}"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

prepare() {
  set -e
  mkdir -p "$carry/bin" "$carry/data/shakespeare"
  local tch="target/tch/release/nanogpt"
  if [ -x "$tch" ]; then
    strip -o "$carry/bin/nanogpt-tch" "$tch"
  else
    echo "no $tch: build it with"
    echo "  bash examples/scripts/install-libtorch.sh && source .venv-libtorch/env.sh"
    echo "  cargo build --release -p examples --features tch --bin nanogpt --target-dir target/tch"
  fi
  local vulkan="target/vulkan/release/nanogpt"
  if [ -x "$vulkan" ]; then
    strip -o "$carry/bin/nanogpt-vulkan" "$vulkan"
    xz -T0 -6 -f "$carry/bin/nanogpt-vulkan"
    mkdir -p "$carry/lib"
    cp -L /usr/lib/x86_64-linux-gnu/libvulkan.so.1 "$carry/lib/" 2>/dev/null ||
      echo "no libvulkan.so.1 here (apt-get install libvulkan1): the lent machine's is used"
  else
    echo "no $vulkan (cargo build --release -p examples --features vulkan --bin nanogpt" \
      "--target-dir target/vulkan): the check runs without Vulkan"
  fi
  local original="${ORIGINAL_GYM_DIR:-../original-gym}"
  if [ -f "$original/exogym/trainer.py" ]; then
    rm -rf "$carry/original-gym"
    mkdir -p "$carry/original-gym"
    cp -r "$original/exogym" "$original/example" "$carry/original-gym/"
    git -C "$original" rev-parse --short=7 HEAD > "$carry/original-gym/COMMIT" 2>/dev/null ||
      cp "$original/COMMIT" "$carry/original-gym/COMMIT" 2>/dev/null || true
  else
    echo "no original source in $original (set ORIGINAL_GYM_DIR): the check runs ours only"
  fi
  cp "${GYM_DATA_DIR:-../shared/data}/shakespeare/input.txt" "$carry/data/shakespeare/"
  du -sh "$carry"
  local bytes
  bytes=$(du -sb "$carry" | cut -f1)
  if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
    echo "target/gpu-check is over the 64 MiB the device tool carries" >&2
    exit 1
  fi
  echo "carry: [\"target/gpu-check\"]"
}

cpu=0
case "${1:-}" in
  --prepare) prepare; exit ;;
  --cpu) cpu=1; shift ;;
  -h | --help | "") usage; exit 0 ;;
esac
[ $# -eq 1 ] || { usage; exit 2; }
out="$(mkdir -p "$1" && cd "$1" && pwd)"
runs="$out/runs"
json="$out/gpu-check.json"
mkdir -p "$runs"
: > "$json"
budget="${GPU_CHECK_BUDGET_S:-450}"
started=$SECONDS

# ── what there is ──────────────────────────────────────────────────────────────────────
torch_lib="$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)"
[ -n "$torch_lib" ] || echo "no torch in $PYTHON: the original and LibTorch runs are skipped"
data="$carry/data"
[ -f "$data/shakespeare/input.txt" ] || data="${GYM_DATA_DIR:-../shared/data}"
original="$carry/original-gym"
[ -f "$original/exogym/trainer.py" ] || original="${ORIGINAL_GYM_DIR:-../original-gym}"
[ -f "$original/exogym/trainer.py" ] || { echo "no original source: ours only"; original=""; }

tch_bin="$carry/bin/nanogpt-tch"
[ -x "$tch_bin" ] || tch_bin=""
vulkan_bin=""
if [ -f "$carry/bin/nanogpt-vulkan.xz" ]; then
  vulkan_bin="$(mktemp -d)/nanogpt-vulkan"
  xz -dc "$carry/bin/nanogpt-vulkan.xz" > "$vulkan_bin" && chmod +x "$vulkan_bin"
elif [ -x target/vulkan/release/nanogpt ]; then
  vulkan_bin="$here/target/vulkan/release/nanogpt"
fi
flex_bin="${CARGO_TARGET_DIR:-target}/release/nanogpt"
# On the lent machine there is no build: the LibTorch binary has flex too (default feature).
[ -x "$flex_bin" ] || flex_bin="$tch_bin"

if [ "$cpu" = 1 ]; then
  echo "== gpu-check --cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  # (name, flags, steps): small, so the whole check takes a few minutes on 2 cores.
  models=("gpt-2x64|--n-layer 2 --n-head 2 --n-embd 64 --block-size 64 --batch-size 8|${GPU_CHECK_STEPS:-12}")
  tch_device="tch"
  vulkan_device="vulkan:cpu"
  if ! command -v vulkaninfo >/dev/null || ! vulkaninfo --summary 2>/dev/null | grep -q llvmpipe; then
    [ -n "$vulkan_bin" ] && echo "no lavapipe (apt-get install mesa-vulkan-drivers vulkan-tools): Vulkan skipped"
    vulkan_bin=""
  fi
  original_device="cpu"
else
  echo "== gpu-check: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
  models=("gpt-6x384|--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 8|${GPU_CHECK_STEPS:-30}"
          "gpt2-small|--n-layer 12 --n-head 12 --n-embd 768 --block-size 256 --batch-size 8|${GPU_CHECK_STEPS:-20}")
  tch_device="tch-cuda:0"
  vulkan_device="vulkan:0"
  original_device="cuda"
fi
strategies=("diloco|-H 10" "allreduce|")
nodes=4
# The settings the original's harness uses for nanoGPT: lr 1e-3, 10 warmup steps, clip 1.0.
common=(--num-nodes "$nodes" --lr 1e-3 --warmup-steps 10 --max-norm 1.0 --seed 42
        --val-size 0 --val-interval 100000 --num-tokens 0 --no-progress)

over_budget() { [ $((SECONDS - started)) -ge "$budget" ]; }

# ours BACKEND BINARY DEVICE MODEL FLAGS STEPS STRATEGY H-FLAGS [EXTRA-FLAGS]
ours() {
  local backend=$1 bin=$2 device=$3 model=$4 flags=$5 steps=$6 strategy=$7 hflags=$8
  local extra=${9:-}
  local name="ours-$backend-$model-$strategy"
  if over_budget; then echo "skipped (time budget): $name"; return; fi
  echo "-- $name"
  # shellcheck disable=SC2086
  (export LD_LIBRARY_PATH="${torch_lib:+$torch_lib:}$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
   export OMP_NUM_THREADS=1 CUBECL_AUTOTUNE_LEVEL="${CUBECL_AUTOTUNE_LEVEL:-minimal}"
   timeout 150 "$bin" --strategy "$strategy" $hflags $flags $extra --max-steps "$steps" \
     --devices "$device" "${common[@]}" --data-dir "$data/shakespeare" \
     --log-dir "$runs" --run-name "$name") > "$runs/$name.log" 2>&1
  local rc=$?
  "$PYTHON" - "$runs/$name" "$backend" "$model" "$strategy" "$rc" "$json" <<'PY'
import json, os, sys
run, backend, model, strategy, rc, out = sys.argv[1:]
row = {"impl": "ours", "backend": backend, "model": model, "strategy": strategy}
try:
    s = json.load(open(os.path.join(run, "summary.json")))
    t = json.load(open(os.path.join(run, "config.json")))["trainer"]
    g = json.load(open(os.path.join(run, "gpt.json")))
except (OSError, ValueError, KeyError):
    rc = int(rc)
    died = f" (signal {rc - 128})" if rc > 128 else ""
    row.update({"error": f"exit {rc}{died}; see {run}.log"})
else:
    tokens = t["num_nodes"] * t["batch_size"] * g["block_size"]
    row.update({"params": s["params"], "nodes": s["num_nodes"], "steps": s["steps"],
                "tokens_per_s": round(s["loop_its_per_s"] * tokens),
                "final_train_loss": s["final_train_loss"], "device": s["backend"],
                "loop_its_per_s": s["loop_its_per_s"], "wall_s": s["wall_time_s"],
                "startup_s": s["startup_s"], "init_fingerprint": s["init_fingerprint"]})
print(json.dumps(row))
open(out, "a").write(json.dumps(row) + "\n")
PY
}

# theirs MODEL FLAGS STEPS STRATEGY H-FLAGS
theirs() {
  local model=$1 flags=$2 steps=$3 strategy=$4 hflags=$5
  local name="original-$model-$strategy"
  if over_budget; then echo "skipped (time budget): $name"; return; fi
  echo "-- $name"
  # shellcheck disable=SC2086
  timeout 240 "$PYTHON" examples/scripts/original_harness.py --gym-dir "$original" \
    --data-dir "$data" --task nanogpt --strategy "$strategy" ${hflags/-H/--sync-interval} \
    $flags --steps "$steps" --num-nodes "$nodes" --lr 1e-3 --warmup-steps 10 --max-norm 1.0 \
    --seed 42 --val-size 0 --val-interval 100000 --eval-size 8 --logs none \
    --device "$original_device" > "$runs/$name.json" 2> "$runs/$name.log"
  local rc=$?
  "$PYTHON" - "$runs/$name" "$model" "$strategy" "$rc" "$json" "$original_device" <<'PY'
import json, sys
run, model, strategy, rc, out, device = sys.argv[1:]
row = {"impl": "original", "backend": f"torch-{device}", "model": model, "strategy": strategy}
try:
    r = json.loads(open(run + ".json").read().strip().splitlines()[-1])
except (OSError, ValueError, IndexError):
    row.update({"error": f"exit {rc}; see {run}.log"})
else:
    row.update({"params": r.get("params"), "nodes": r["num_nodes"], "steps": r["steps"],
                "tokens_per_s": r["tokens_per_s"], "final_train_loss": r.get("final_train_loss"),
                "device": r.get("device"), "loop_its_per_s": r["its_per_s"],
                "wall_s": r["wall_s"], "startup_s": r["startup_s"], "torch": r.get("torch"),
                "original_commit": r.get("original_commit")})
print(json.dumps(row))
open(out, "a").write(json.dumps(row) + "\n")
PY
}

for m in "${models[@]}"; do
  IFS='|' read -r model flags steps <<<"$m"
  for s in "${strategies[@]}"; do
    IFS='|' read -r strategy hflags <<<"$s"
    if [ "$cpu" = 1 ] && [ -n "$flex_bin" ]; then
      ours flex "$flex_bin" flex "$model" "$flags" "$steps" "$strategy" "$hflags"
    fi
    [ -n "$tch_bin" ] && [ -n "$torch_lib" ] &&
      ours tch "$tch_bin" "$tch_device" "$model" "$flags" "$steps" "$strategy" "$hflags"
    [ -n "$original" ] && [ -n "$torch_lib" ] &&
      theirs "$model" "$flags" "$steps" "$strategy" "$hflags"
  done
done
# The same seed's curve on the CPU (flex) beside the GPU's, for the first configuration.
IFS='|' read -r model flags steps <<<"${models[0]}"
if [ "$cpu" = 0 ] && [ -n "$flex_bin" ]; then
  ours flex "$flex_bin" flex "$model" "$flags" "$steps" diloco "-H 10"
fi
if [ -n "$vulkan_bin" ]; then
  for m in "${models[@]}"; do
    IFS='|' read -r model flags steps <<<"$m"
    for s in "${strategies[@]}"; do
      IFS='|' read -r strategy hflags <<<"$s"
      ours vulkan "$vulkan_bin" "$vulkan_device" "$model" "$flags" "$steps" "$strategy" "$hflags"
    done
  done
fi
# bf16 autocast (the original's is broken: it passes torch.autocast a device, not its type),
# on the largest model, where tensor cores matter.
IFS='|' read -r model flags steps <<<"${models[${#models[@]}-1]}"
if [ "$cpu" = 0 ] && [ -n "$tch_bin" ] && [ -n "$torch_lib" ]; then
  ours tch-bf16 "$tch_bin" "$tch_device" "$model" "$flags" "$steps" diloco "-H 10" "--autocast bf16"
fi
if [ "$cpu" = 0 ] && [ -n "$vulkan_bin" ]; then
  ours vulkan-bf16 "$vulkan_bin" "$vulkan_device" "$model" "$flags" "$steps" diloco "-H 10" "--autocast bf16"
fi

# ── the table ──────────────────────────────────────────────────────────────────────────
"$PYTHON" - "$json" "$runs" "$((SECONDS - started))" <<'PY'
import csv, json, os, sys
path, runs, took = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
base = {(r["model"], r["strategy"]): r for r in rows
        if r["impl"] == "original" and "tokens_per_s" in r}

def losses(r):
    f = os.path.join(runs, f"ours-{r['backend']}-{r['model']}-{r['strategy']}", "train.csv")
    with open(f) as fh:
        return [float(x["train_loss"]) for x in csv.DictReader(fh)]

# The curves: every backend's run against flex's, step by step, where both ran.
curves = []
for r in rows:
    if r["impl"] != "ours" or r["backend"] == "flex" or "tokens_per_s" not in r:
        continue
    ref = next((x for x in rows if x["impl"] == "ours" and x["backend"] == "flex"
                and "tokens_per_s" in x and (x["model"], x["strategy"]) ==
                (r["model"], r["strategy"])), None)
    if ref is None:
        continue
    a, b = losses(ref), losses(r)
    gap = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    line = {"curve": f"{r['backend']} against flex", "model": r["model"],
            "strategy": r["strategy"], "steps": min(len(a), len(b)),
            "same_start": ref.get("init_fingerprint") == r.get("init_fingerprint"),
            "first_loss": [a[0], b[0]], "last_loss": [a[-1], b[-1]],
            "max_relative_gap": gap}
    curves.append(line)
with open(path, "a") as f:
    for c in curves:
        f.write(json.dumps(c) + "\n")

head = ["impl", "backend", "model", "params", "nodes", "strategy", "steps", "tokens/s",
        "final train loss", "ours ÷ original"]
print()
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for r in rows:
    if "tokens_per_s" not in r:
        print(f"| {r['impl']} | {r['backend']} | {r['model']} | | | {r['strategy']} | | "
              f"failed: {r.get('error')} | | |")
        continue
    b = base.get((r["model"], r["strategy"]))
    ratio = (f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}"
             if b and r["impl"] == "ours" else "")
    loss = r.get("final_train_loss")
    print(f"| {r['impl']} | {r['backend']} | {r['model']} | {r.get('params') or ''} | "
          f"{r['nodes']} | {r['strategy']} | {r['steps']} | {r['tokens_per_s']} | "
          f"{'' if loss is None else f'{loss:.4f}'} | {ratio} |")
for c in curves:
    print(f"curve {c['curve']}, {c['model']} {c['strategy']}: same start {c['same_start']}, "
          f"loss {c['first_loss'][0]:.4f} → {c['last_loss'][0]:.4f} (flex) and "
          f"{c['first_loss'][1]:.4f} → {c['last_loss'][1]:.4f}, "
          f"largest gap {c['max_relative_gap']:.2e} relative over {c['steps']} steps")
print(f"\n{len(rows)} runs in {took} s; {path}")
PY
