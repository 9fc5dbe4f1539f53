#!/usr/bin/env bash
# Run the original Python EXO Gym (github.com/exo-explore/gym) on the set-ups of
# `bench --task mnist` / `bench --task nanogpt` and append one JSON line per run to a file
# that `bench --peer-results FILE` reads (the format of docs/original-results.jsonl).
#
# Run it from the repository root:
#
#   git clone https://github.com/exo-explore/gym ../original-gym    # once (needs internet)
#   python3 -m pip install torch numpy tqdm psutil einops           # the original's imports
#   bash examples/scripts/run-original.sh --task mnist               # MLP, every strategy
#   bash examples/scripts/run-original.sh --task nanogpt             # allreduce, diloco
#   bash examples/scripts/run-original.sh --task cnn                 # the CNN, allreduce
#   target/release/bench --peer-results logs/original-results.jsonl
#
# Options:
#   --task mnist|cnn|nanogpt|all   set-up (default mnist; all = mnist, then nanogpt, then cnn)
#   --steps N                      steps per run (default: mnist 200, cnn 10, nanogpt 100)
#   --strategies a,b,...           default: mnist allreduce,diloco,sparta,fedavg,
#                                  sparta-diloco,demo; nanogpt allreduce,diloco; cnn allreduce
#   --out FILE                     JSON lines appended here (default logs/original-results.jsonl)
#   --gym-dir DIR                  the original's source (default $ORIGINAL_GYM_DIR, else
#                                  ../original-gym)
#   --data-dir DIR                 folder with mnist/ and shakespeare/ (default
#                                  $GYM_DATA_DIR, else ../shared/data)
#   --clone                        git clone the original into --gym-dir if it is missing
#   -- ARGS                        passed on to original_harness.py (see its --help), e.g.
#                                  -- --logs none --num-nodes 2
#
# Environment: PYTHON (default python3) is the interpreter, with torch, numpy, tqdm, psutil
# and einops installed. Each of the original's node processes runs torch with
# OMP_NUM_THREADS threads (default 1, as this project's nodes use one kernel thread each;
# `-- --threads 0` gives torch's default, one per core in every process, which is what the
# original does by itself and oversubscribes the cores: several times slower on 2 cores).
#
# Each run is a process of its own; the JSON line of a run is also printed. Timings are only
# meaningful on an otherwise quiet machine: the original runs one process per node.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
task=mnist
steps=""
strategies=""
out=logs/original-results.jsonl
gym_dir="${ORIGINAL_GYM_DIR:-../original-gym}"
data_dir="${GYM_DATA_DIR:-../shared/data}"
clone=0
extra=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --task) task="$2"; shift 2 ;;
        --task=*) task="${1#*=}"; shift ;;
        --steps) steps="$2"; shift 2 ;;
        --steps=*) steps="${1#*=}"; shift ;;
        --strategies) strategies="$2"; shift 2 ;;
        --strategies=*) strategies="${1#*=}"; shift ;;
        --out) out="$2"; shift 2 ;;
        --out=*) out="${1#*=}"; shift ;;
        --gym-dir) gym_dir="$2"; shift 2 ;;
        --gym-dir=*) gym_dir="${1#*=}"; shift ;;
        --data-dir) data_dir="$2"; shift 2 ;;
        --data-dir=*) data_dir="${1#*=}"; shift ;;
        --clone) clone=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "run-original.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

if [ ! -f "$gym_dir/exogym/trainer.py" ]; then
    if [ "$clone" = 1 ]; then
        git clone https://github.com/exo-explore/gym "$gym_dir"
    else
        echo "run-original.sh: the original's source is not at '$gym_dir'." >&2
        echo "  git clone https://github.com/exo-explore/gym $gym_dir   (or --clone)," >&2
        echo "  or point --gym-dir / ORIGINAL_GYM_DIR at a clone." >&2
        exit 1
    fi
fi

case "$task" in
    mnist|cnn|nanogpt) tasks=("$task") ;;
    all) tasks=(mnist nanogpt cnn) ;;
    *) echo "run-original.sh: --task must be mnist, cnn, nanogpt or all" >&2; exit 2 ;;
esac

if ! "$PYTHON" -c 'import torch, numpy, tqdm, psutil, einops' 2>/dev/null; then
    echo "run-original.sh: $PYTHON lacks a module the original needs;" >&2
    echo "  $PYTHON -m pip install torch numpy tqdm psutil einops" >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
failed=()
for t in "${tasks[@]}"; do
    list="$strategies"
    if [ -z "$list" ]; then
        case "$t" in
            mnist) list=allreduce,diloco,sparta,fedavg,sparta-diloco,demo ;;
            nanogpt) list=allreduce,diloco ;;
            # DeMo cannot run on the CNN in the original (its DCT compressor takes no
            # parameters of more than 2 dimensions; the convolutions have 4).
            cnn) list=allreduce ;;
        esac
    fi
    IFS=',' read -r -a strats <<< "$list"
    for s in "${strats[@]}"; do
        args=(--gym-dir "$gym_dir" --data-dir "$data_dir" --task "$t" --strategy "$s" --out "$out")
        if [ -n "$steps" ]; then args+=(--steps "$steps"); fi
        echo "== original EXO Gym: $t, $s ==" >&2
        start=$(date +%s)
        if "$PYTHON" "$script_dir/original_harness.py" "${args[@]}" "${extra[@]}"; then
            echo "== $t $s done in $(( $(date +%s) - start )) s ==" >&2
        else
            echo "== $t $s FAILED ==" >&2
            failed+=("$t/$s")
        fi
    done
done

echo "results appended to $out" >&2
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed runs: ${failed[*]}" >&2
    exit 1
fi
