#!/usr/bin/env bash
# The GPU checks of the stack, from the repository root of a GPU host: the GPU test suite and the benchmarks
# whose results BENCHMARKS.md reports. Each argument names one check; several run in the order given
# (`bash benchmarks/device_checks.sh zero1 multigpu scaling`); none means `all`.
#
#   tests    the whole GPU suite, `pytest tests -m gpu` (over 10 minutes on one H200): the three parts below
#   tests1   its gr00t-model and gr00t-train files (about 4 minutes)
#   tests2   its integration files: whole training runs on the GPU (about 6 minutes)
#   tests3   its vla-io, vla-overlap and vla-graph files (about 3 minutes)
#   tests23  parts 2 and 3 at once, two pytest processes sharing the GPU (about 6 minutes: part 3's kernel
#            tests need little of it and passed beside a training benchmark)
#   ladder   the ablation ladder on a synthetic LIBERO-like dataset (benchmarks/train_ablation.py)
#   all      tests, then ladder
#   speed    the full step (and with FP8 for the frozen prefix) beside torch.compile(mode="reduce-overhead")
#            on a fixed batch, then the 200-step loss parity of both against eager (benchmarks/step_variants.py;
#            about 10 minutes)
#   scaling  the full stack at world size 1 and at every GPU of the host (benchmarks/train_scaling.py)
#   parity   300 steps with fp32 (twice) and bf16 gradient reduction at every GPU (benchmarks/grad_reduce_parity.py)
#   zero1    the captured-sync check at every GPU (tests/integration/_graph_overlap_check.py), then how often each
#            variant of the sync in graphs differs from eager over 20 rounds (benchmarks/zero1_graph_probe.py;
#            about 4 minutes at 2 GPUs)
#   multigpu the tests that need two or more GPUs, `pytest tests -m multigpu`
#   profile  the full stack at world size 1 and at every GPU with 3 steps under torch.profiler
#            (`logging.profile_steps`): kernel time by family and rank 0's timeline per world size
#   job      the whole job: 2,000 steps with a checkpoint and a validation every 500, cold and warm start-up
#            (benchmarks/time_to_model.py; about 7 minutes)
#   startup  the start-up alone, cold then warm: a 12-step run without saves or validation, then the warm
#            process, then one on empty caches with the cold run's compile cache file (`--fresh-host`;
#            benchmarks/time_to_model.py; about 4 minutes); with TIMERS=1 every process prints the seconds
#            of multi-kernel picking and Triton compiles (benchmarks/probes/compile_timers); with SAMPLE=1 the
#            first two run under
#            benchmarks/stack_sampler.py, which writes where their main threads' time went
#   memory   the memory budgets 24, 32 and 48 GiB, uncapped and LoRA rank 32, refitting the planner's GPU
#            calibration (benchmarks/memory_budget.py; about 7 minutes)
#   loss     300-step loss curves of FP8, 8-bit moments and LoRA against full precision, and the reference
#            twice (benchmarks/loss_parity.py; about 8 minutes)
#   data     a 3-dataset mixture beside one dataset, then the frozen-prefix cache beside video
#            (benchmarks/mixture.py, benchmarks/prefix_cache.py; about 9 minutes)
#   io       vla-io on a LeRobot v3.0 set of real-size files (2,000 episodes in 200 MB videos), 4 minutes of
#            loading with memory and open files sampled (benchmarks/io_scale.py; about 9 minutes)
#
# Needs PyAV and torchcodec: benchmarks/gpu_env.sh installs them from wheels in .gpu/whl (benchmarks/README.md
# says how to get them). Results go to $OUT (default /tmp/device_checks): gpu.txt (the GPU, driver and torch),
# pytest_gpu*.txt, the ladder's JSON and log, and each check's JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
out=${OUT:-/tmp/device_checks}
mkdir -p "$out"
day=$(date -u +%F)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$out/gpu.txt"
status=0
gpus=$(nvidia-smi --list-gpus | wc -l)
parts=("tests/gr00t_model tests/gr00t_train" "tests/integration" "tests/vla_io tests/vla_overlap tests/vla_graph")
gpu_tests() {  # gpu_tests NAME DIRS...: one pytest run of the GPU tests in DIRS, with its slowest tests named
  local name=$1; shift
  # shellcheck disable=SC2068  # the directories split on purpose
  python3 -m pytest $@ -m gpu -q -rfE --tb=short --durations=15 -p no:cacheprovider --basetemp "/tmp/$name" \
    > "$out/$name.txt" 2>&1 || status=1  # a folder of its own: two runs at once never share one
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/$name.txt" | tail -n 12
}
libero() {  # libero [EPISODES]: the synthetic LIBERO-like set in $data (6 episodes unless given)
  data=/tmp/libero${1:-}
  [ -f "$data/meta/info.json" ] || python3 -m vla_io synth "$data" --preset libero --episodes "${1:-6}" > /dev/null
}
for what in "${@:-all}"; do
for part in 1 2 3; do
  if [ "$what" = "tests$part" ] || [ "$what" = tests ] || [ "$what" = all ]; then
    # shellcheck disable=SC2086
    gpu_tests "pytest_gpu_part$part" ${parts[$((part - 1))]}
  fi
done
if [ "$what" = tests23 ]; then
  # shellcheck disable=SC2086
  (status=0; gpu_tests pytest_gpu_part3 ${parts[2]}; exit $status) > "$out/part3_summary.txt" &
  part3=$!
  # shellcheck disable=SC2086
  gpu_tests pytest_gpu_part2 ${parts[1]}
  wait $part3 || status=1
  cat "$out/part3_summary.txt"
fi
if [ "$what" = ladder ] || [ "$what" = all ]; then
  libero
  (cd benchmarks && python3 train_ablation.py --dataset "$data" --steps 20 --warmup 6 --workers 12 \
    --json "$out/train_ablation_h200_$day.json") > "$out/ladder.log" 2>&1 || status=1
  tail -n 20 "$out/ladder.log"
fi
if [ "$what" = zero1 ]; then
  python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" tests/integration/_graph_overlap_check.py cuda \
    2>&1 | grep "vs eager\|OK" || status=1
  python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" benchmarks/zero1_graph_probe.py --reps 20 \
    --variants zero1,overlap,zero1-all-reduce,zero1-no-side-stream,zero1-grads-exposed,zero1-synced \
    2>&1 | grep "differ\|Error" | tee "$out/zero1_graph_probe.txt" || status=1
fi
if [ "$what" = multigpu ]; then
  python3 -m pytest tests -m multigpu -q -p no:cacheprovider > "$out/pytest_multigpu.txt" 2>&1 || status=1
  tail -n 5 "$out/pytest_multigpu.txt"
fi
if [ "$what" = scaling ]; then
  libero
  python3 benchmarks/train_scaling.py --dataset "$data" --nproc "1,$gpus" --out /tmp/train_scaling \
    --json "$out/train_scaling_h200x${gpus}_$day.json" > "$out/scaling.log" 2>&1 || status=1
  tail -n 8 "$out/scaling.log"
fi
if [ "$what" = profile ]; then
  libero
  python3 benchmarks/train_scaling.py --dataset "$data" --nproc "1,$gpus" --steps 6 --out /tmp/profiled \
    --set logging.profile_steps=3 > "$out/profile.log" 2>&1 || status=1
  for ws in 1 "$gpus"; do
    cp "/tmp/profiled/ws$ws/kernels_rank0.json" "$out/kernels_ws$ws.json"
    cp "/tmp/profiled/ws$ws/trace_rank0.json.gz" "$out/trace_ws$ws.json.gz"
  done
  tail -n 8 "$out/profile.log"
fi
if [ "$what" = parity ]; then
  libero
  python3 benchmarks/grad_reduce_parity.py --dataset "$data" --nproc "$gpus" --steps 300 --out /tmp/parity \
    --json "$out/grad_reduce_parity_h200x${gpus}_$day.json" > "$out/parity.log" 2>&1 || status=1
  tail -n 6 "$out/parity.log"
fi
if [ "$what" = speed ]; then
  python3 benchmarks/step_variants.py --rows ours-full,ours-full-fp8,free-reduce-overhead,parity,parity=ours-full-fp8 --steps 30 --warmup 5 \
    --json "$out/step_variants_h200_$day.json" > "$out/step_variants.log" 2>&1 || status=1
  tail -n 20 "$out/step_variants.log"
fi
if [ "$what" = job ]; then
  libero 20  # one episode held out for validation (data.val_episodes=0.05)
  python3 benchmarks/time_to_model.py --dataset "$data" --json "$out/time_to_model_h200_$day.json" \
    > "$out/job.log" 2>&1 || status=1
  tail -n 25 "$out/job.log"
fi
if [ "$what" = startup ]; then
  libero
  [ -n "${TIMERS:-}" ] && export PYTHONPATH="$PWD/benchmarks/probes/compile_timers:${PYTHONPATH:-}"
  python3 benchmarks/time_to_model.py --dataset "$data" --steps 12 --every 1000 --eval-every 0 --fresh-host \
    --set checkpoint.save_final=false --out /tmp/startup_probe --json "$out/startup_probe_h200_$day.json" \
    ${SAMPLE:+--sample-warm "$out/startup_warm_samples_h200_$day.txt"} \
    ${SAMPLE:+--sample-cold "$out/startup_cold_samples_h200_$day.txt"} > "$out/startup.log" 2>&1 || status=1
  grep -E "start-up|model phase|compile caches|compile timers|job " "$out/startup.log"
  cp /tmp/startup_probe/fresh.stderr.log "$out/startup_fresh.stderr.log" 2>/dev/null
  grep TIMER /tmp/startup_probe/*.stderr.log 2>/dev/null  # TIMERS=1: each process's line
  cp /tmp/startup_probe/job.stderr.log "$out/startup_cold.stderr.log" 2>/dev/null
  cp /tmp/startup_probe/warm.stderr.log "$out/startup_warm.stderr.log" 2>/dev/null
fi
if [ "$what" = memory ]; then
  libero
  python3 benchmarks/memory_budget.py --dataset "$data" --rows 24,32,48,none,lora --write-calibration \
    --json "$out/memory_budget_h200_$day.json" > "$out/memory.log" 2>&1 || status=1
  cp packages/gr00t-train/src/gr00t_train/memory/calibration.json "$out/"
  tail -n 12 "$out/memory.log"
fi
if [ "$what" = loss ]; then
  libero 20  # one episode held out for validation (data.val_episodes=0.05)
  python3 benchmarks/loss_parity.py --dataset "$data" --json "$out/loss_parity_h200_$day.json" \
    > "$out/loss.log" 2>&1 || status=1
  tail -n 12 "$out/loss.log"
fi
if [ "$what" = data ]; then
  python3 benchmarks/mixture.py --json "$out/mixture_h200_$day.json" > "$out/mixture.log" 2>&1 || status=1
  tail -n 8 "$out/mixture.log"
  python3 benchmarks/prefix_cache.py --json "$out/prefix_cache_h200_$day.json" > "$out/prefix_cache.log" 2>&1 || status=1
  tail -n 10 "$out/prefix_cache.log"
fi
if [ "$what" = io ]; then
  python3 benchmarks/io_scale.py --device cuda --sets real --minutes 4 --json "$out/io_scale_h200_$day.json" \
    > "$out/io_scale.log" 2>&1 || status=1
  tail -n 15 "$out/io_scale.log"
fi
done
exit $status
