#!/usr/bin/env bash
# PyTorch reference speed for shardlm's training benchmark (issue 7): runs
# tools/pytorch_gpt2_ref.py on gpt2-small-30m (L6 H6 C384, B=8, T=256) and gpt2 124M
# (L12 H12 C768, B=1, T=1024), fp32 and bf16 autocast, in two environments:
#   default  the plain environment
#   tuned    Debian's OpenMP build of OpenBLAS first on LD_LIBRARY_PATH,
#            OPENBLAS_CORETYPE=SkylakeX, jemalloc preloaded with decay off
# and prints one table. Benchmark only: never run from tests. The tuned environment
# needs libopenblas0-openmp and libjemalloc2; they are installed here if missing
# (benchmark-only dependencies, deliberately not in scripts/install-deps.sh;
# libopenblas0-openmp registers at a lower alternatives priority than the pthread
# build, so the system's default OpenBLAS stays the pthread one).
#
# usage: bench/pytorch_ref.sh [--steps N] [--warmup N] [--threads N]
#                             [--configs small,124m] [--dtypes fp32,bf16] [--envs default,tuned]
#                             [--results FILE]   (also keep the JSON result lines in FILE)
set -euo pipefail

steps=10
warmup=2
threads=2
configs=small,124m
dtypes=fp32,bf16
envs=default,tuned
keep_results=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --envs) envs=$2; shift 2 ;;
    --results) keep_results=$2; shift 2 ;;
    *) echo "pytorch_ref.sh: unknown argument $1 (see the usage line at the top of $0)" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
trainer="$here/../tools/pytorch_gpt2_ref.py"
python=/usr/bin/python3
libdir=/usr/lib/x86_64-linux-gnu
openblas_openmp_dir=$libdir/openblas-openmp
jemalloc=$libdir/libjemalloc.so.2

if [[ ",$envs," == *",tuned,"* ]]; then
  missing=()
  [ -e "$openblas_openmp_dir/libblas.so.3" ] || missing+=(libopenblas0-openmp)
  [ -e "$jemalloc" ] || missing+=(libjemalloc2)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing benchmark-only packages: ${missing[*]}" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

config_args() {
  case "$1" in
    small) echo "--n-layer 6 --n-head 6 --n-embd 384 --batch 8 --seq-len 256" ;;
    124m) echo "--n-layer 12 --n-head 12 --n-embd 768 --batch 1 --seq-len 1024" ;;
  esac
}

IFS=, read -r -a config_list <<<"$configs"
IFS=, read -r -a dtype_list <<<"$dtypes"
IFS=, read -r -a env_list <<<"$envs"
for config in "${config_list[@]}"; do
  [[ "$config" == small || "$config" == 124m ]] ||
    { echo "pytorch_ref.sh: unknown config $config (expected small or 124m)" >&2; exit 2; }
done
for dtype in "${dtype_list[@]}"; do
  [[ "$dtype" == fp32 || "$dtype" == bf16 ]] ||
    { echo "pytorch_ref.sh: unknown dtype $dtype (expected fp32 or bf16)" >&2; exit 2; }
done
for env_name in "${env_list[@]}"; do
  [[ "$env_name" == default || "$env_name" == tuned ]] ||
    { echo "pytorch_ref.sh: unknown env $env_name (expected default or tuned)" >&2; exit 2; }
done

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for config in "${config_list[@]}"; do
  for dtype in "${dtype_list[@]}"; do
    for env_name in "${env_list[@]}"; do
      case "$env_name" in
        default) run_env=() ;;
        tuned) run_env=(LD_LIBRARY_PATH="$openblas_openmp_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                        OPENBLAS_CORETYPE=SkylakeX LD_PRELOAD="$jemalloc"
                        MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1) ;;
      esac
      echo "== $config $dtype $env_name" >&2
      # Step lines go to stderr as they come; the final JSON line is kept for the table.
      # shellcheck disable=SC2046
      env "${run_env[@]}" "$python" "$trainer" $(config_args "$config") --dtype "$dtype" \
        --threads "$threads" --steps "$steps" --warmup "$warmup" \
        --label "$config $dtype $env_name" |
        while IFS= read -r line; do
          echo "$line" >&2
          if [[ "$line" == "{"* ]]; then echo "$line" >>"$results"; fi
        done
    done
  done
done

[ -z "$keep_results" ] || cp "$results" "$keep_results"
"$python" - "$results" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print("| config | dtype | env | threads | steps (warm-up) | median ms/step | tokens/s | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    config, dtype, env = r["label"].split()
    print(f"| {config} (L{r['n_layer']} C{r['n_embd']} B{r['batch']} T{r['seq_len']}) | {dtype} | "
          f"{env} | {r['threads']} | {r['steps']} ({r['warmup']}) | {r['median_step_ms']:.0f} | "
          f"{r['tokens_per_s']:.0f} | {r['peak_rss_mib']:.0f} |")
EOF
