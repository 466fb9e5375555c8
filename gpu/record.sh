#!/usr/bin/env bash
# Record on a GPU machine what CI cannot see: every preset for real (story 2 with a
# 15 GiB per-process cap, like the question's cards), the probe's cost on CUDA, and
# the real NVML panel. Run from the project root with the wheels of
# ../shared/gpu/wheels.sh in .whl/; everything lands under $OUT (or ./gpu-out).
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 SHARDTOP_RUNS_DIR=${SHARDTOP_RUNS_DIR:-/tmp/shardtop-gpu-runs}
CAP=${CAP:-15GiB}
DEADLINE=$((SECONDS + ${BUDGET_S:-510}))  # leave time to pack the results

left() { local want=$1 rest=$((DEADLINE - SECONDS)); [ "$rest" -lt "$want" ] && want=$rest; echo "$want"; }

launch() {  # seconds, then the launch arguments
  local limit; limit=$(left "$1"); shift
  [ "$limit" -gt 10 ] || { echo "=== skipped (out of time): $* ==="; return; }
  echo "=== shardtop launch $* ($(date +%T), up to ${limit}s) ==="
  timeout "$limit" python3 -m shardtop launch "$@" --headless --every 5
  echo "=== exit $? ==="
}

{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, lightning, deepspeed; print(sys.version.split()[0], torch.__version__, lightning.__version__, deepspeed.__version__)"
  launch 150 zero3-linear gpu_mem_limit=$CAP max_steps=5
  launch 150 zero3-linear-fixed gpu_mem_limit=$CAP max_steps=5
  launch 70 fsdp-not-sharding max_steps=5
  launch 70 fsdp-auto-wrap max_steps=5
  launch 60 ddp-baseline max_steps=5
  launch 60 manual-placement max_steps=5
  launch 60 fsdp2-mlp max_steps=20
  for run in "$SHARDTOP_RUNS_DIR"/*/; do
    timeout "$(left 20)" python3 -m shardtop report "$run" --format markdown > "$run/report.md" 2>&1
  done
  echo "=== probe benchmark ($(date +%T)) ==="
  timeout "$(left 90)" python3 bench/bench_probe.py --device cuda
  if [ -n "${LIVE_SHOT:-}" ] && [ -f screenshots/make_screenshots.py ]; then
    echo "=== live NVML screenshot ($(date +%T)) ==="
    timeout "$(left 60)" python3 screenshots/make_screenshots.py --live-gpu --out "$OUT"
  fi
  python3 -m shardtop runs --limit 0
} 2>&1 | tee "$OUT/gpu.log"
tar czf "$OUT/gpu-runs.tgz" -C "$(dirname "$SHARDTOP_RUNS_DIR")" "$(basename "$SHARDTOP_RUNS_DIR")"
