#!/usr/bin/env bash
# Which cache makes a cold start slow: one cold `gr00t-train train` (2 steps, n1.6-3b on the synthetic
# LIBERO-like set) filling private caches, a warm start on all of them, then warm starts that each begin with
# one cache emptied (Triton's kernel cache, the CUDA driver's JIT cache). Prints each run's start-up phases
# and the size of each cache. From the repository root of a GPU host.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu_env.sh
data=/tmp/libero
[ -f "$data/meta/info.json" ] || python3 -m vla_io synth "$data" --preset libero --episodes 6 > /dev/null 2>&1
root=/tmp/cache_probe
rm -rf "$root" && mkdir -p "$root"
run() {  # run NAME VAR=VALUE...: one short training run under these variables
  local name=$1; shift
  env "$@" python3 -m gr00t_train train --overwrite --set "data.dataset=$data" --set data.cameras=image,wrist_image \
    --set steps=2 --set "output_dir=$root/out_$name" --set logging.progress=false \
    --set checkpoint.save_final=false > /dev/null 2> "$root/$name.log"
  echo "$name: $(grep -o 'start-up: .*' "$root/$name.log" | head -n 1)"
}
base=("TORCHINDUCTOR_CACHE_DIR=$root/inductor" "TRITON_CACHE_DIR=$root/triton" "CUDA_CACHE_PATH=$root/nv"
      "PYTHONPYCACHEPREFIX=$root/pycache")
run cold "${base[@]}"
du -sh "$root/inductor" "$root/triton" "$root/nv" 2> /dev/null
run warm "${base[@]}"
run without_triton_cache "${base[@]}" "TRITON_CACHE_DIR=$root/triton_empty"
run without_cuda_jit_cache "${base[@]}" "CUDA_CACHE_PATH=$root/nv_empty"
