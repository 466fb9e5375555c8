#!/usr/bin/env bash
# Record on a GPU machine what CI cannot see: the presets for real (story 2 with a 15 GiB
# per-process cap, like the question's cards), the scenarios only a GPU shows, a user's own
# script under `shardtop run`, and the benchmarks' GPU figures.
#
#   gpu/record.sh PART...     PART: presets1 presets2 scenarios1 scenarios2 own benches (= probe_cost terminal)
#                             rehearse_story2 rehearse_presets rehearse_own clients client_plans compiled
#                             over_time story2_fixed_six workspaces unmeasured split_rechecks
#                             presets_again oom_recheck what_is_kept script_tensors kept_places startup oom_stories
#                             fit (= fit_story2 fit_hf) clients_cost probe_profile trl_zero3 torchtitan_debug
#
# presets1/scenarios1 and the rehearse_* parts need one GPU, presets2/scenarios2 two. Run from the project root with the
# wheels of ../shared/gpu/wheels.sh in .whl/; everything lands under $OUT (or ./gpu-out):
# gpu.log, and gpu-runs.tgz with every run directory and its report.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
if ! command -v deepspeed >/dev/null; then  # wheels carried with --target bring no console scripts: make pip's
  mkdir -p /tmp/bin && printf '#!/usr/bin/env python3\nfrom deepspeed.launcher.runner import main\nmain()\n' > /tmp/bin/deepspeed
  chmod +x /tmp/bin/deepspeed && export PATH=/tmp/bin:$PATH
fi
export PYTHONUNBUFFERED=1 SHARDTOP_RUNS_DIR=${SHARDTOP_RUNS_DIR:-/tmp/shardtop-gpu-runs} NCCL_NVLS_ENABLE=0
CAP=${CAP:-15GiB}
PLANS=${PLANS:-$SHARDTOP_RUNS_DIR-plans}
DEADLINE=$((SECONDS + ${BUDGET_S:-540}))  # leave time to pack the results
st() { python3 -m shardtop "$@"; }

left() { local want=$1 rest=$((DEADLINE - SECONDS)); [ "$rest" -lt "$want" ] && want=$rest; echo "$want"; }

step() {  # seconds, a title, then the command
  local limit title; limit=$(left "$1"); title=$2; shift 2
  [ "$limit" -gt 10 ] || { echo "=== skipped (out of time): $title ==="; return; }
  echo "=== $title ($(date +%T), up to ${limit}s) ==="
  timeout "$limit" "$@"
  echo "=== exit $? ==="
}

launch() { local s=$1; shift; step "$s" "shardtop launch $*" python3 -m shardtop launch "$@" --headless --every 5; }

presets1() {
  launch 150 zero3-linear devices=1 gpu_mem_limit=$CAP max_steps=3
  launch 150 zero3-linear-fixed devices=1 model.n_layers=4000 gpu_mem_limit=$CAP max_steps=3
  launch 60 fsdp-not-sharding devices=1 max_steps=5
  launch 60 fsdp-auto-wrap devices=1 max_steps=5
  launch 50 ddp-baseline devices=1 max_steps=5
  launch 50 manual-placement max_steps=5
  launch 50 fsdp2-mlp devices=1 max_steps=10
}

presets2() {
  launch 90 fsdp-not-sharding devices=2 max_steps=5
  launch 90 fsdp-auto-wrap devices=2 max_steps=5
  launch 150 zero3-linear-fixed devices=2 model.n_layers=2000 gpu_mem_limit=$CAP max_steps=3
  launch 200 zero3-linear-fixed devices=2 model.n_layers=4000 gpu_mem_limit=$CAP max_steps=3
  launch 60 ddp-baseline devices=2 max_steps=5
  launch 60 fsdp2-mlp devices=2 max_steps=10
  launch 60 manual-placement max_steps=5
  launch 120 zero3-linear devices=2 model.n_layers=4000 gpu_mem_limit=3584MiB max_steps=3
}

rehearse() { local s=$1; shift; step "$s" "shardtop rehearse $*" python3 -m shardtop rehearse --headless --every 5 "$@"; }

rehearse_story2() {  # story 2 on six GPUs, as asked and fixed, and the 4000-layer run on two, each rank 0 on one GPU
  rehearse 150 zero3-linear devices=6 gpu_mem_limit=$CAP max_steps=3
  rehearse 330 zero3-linear-fixed devices=6 gpu_mem_limit=$CAP max_steps=3
  rehearse 120 zero3-linear-fixed devices=2 model.n_layers=4000 gpu_mem_limit=$CAP max_steps=3
}

rehearse_presets() {  # the two-GPU presets, both ranks, one after another on one GPU
  rehearse 90 fsdp-not-sharding devices=2 rank=all max_steps=5
  rehearse 90 fsdp-auto-wrap devices=2 rank=all max_steps=5
  rehearse 330 zero3-linear-fixed devices=2 rank=all model.n_layers=2000 gpu_mem_limit=$CAP max_steps=3
}

rehearse_own() {  # users' own commands, unchanged, as rank 0 and the last rank of eight
  local s=tests/own_scripts
  rehearse 90 devices=8 rank=0,last -- torchrun --standalone --nproc_per_node 8 $s/hf_trainer.py --cuda --deepspeed $s/ds_zero3.json
  rehearse 90 devices=8 rank=0,last -- deepspeed --num_gpus 8 $s/zero3_train.py --cuda
  rehearse 60 devices=8 rank=0,last -- torchrun --standalone --nproc_per_node 8 $s/fsdp2_train.py --cuda
  rehearse 90 devices=8 rank=0,last -- accelerate launch --config_file $s/accelerate_zero3.yaml --num_processes 8 $s/accelerate_train.py --cuda
  rehearse 80 devices=8 rank=0,last -- python3 gpu/scenarios/lightning_deepspeed_user.py --devices 8 --layers 4 --steps 3
}

workspaces() {  # what convolutions' backward takes beyond tensors (the plan's cuDNN figures); the small OOM again
  step 60 "conv workspace" python3 gpu/scenarios/conv_workspace.py --out "$OUT/conv_workspace.json"
  step 60 "outside pytorch, OOM" python3 gpu/scenarios/outside_pytorch.py --outside-gib 128 --ask-gib 16
  launch 60 manual-placement max_steps=5
}

unmeasured() {  # the plan where it has no measured workspace: manual-placement at batch 4, and cuDNN's figure there
  step 60 "conv workspace, batch 4" python3 gpu/scenarios/conv_workspace.py --batches 4 --no-preset --out "$OUT/conv_workspace_b4.json"
  launch 60 manual-placement batch_size=4 max_steps=5
}

presets_again() {  # h200/'s seven runs of 2026-11-29, with the same settings, by today's probe
  launch 150 zero3-linear gpu_mem_limit=$CAP max_steps=5
  launch 150 zero3-linear-fixed gpu_mem_limit=$CAP max_steps=5
  launch 60 fsdp-not-sharding max_steps=5
  launch 60 fsdp-auto-wrap max_steps=5
  launch 50 ddp-baseline max_steps=5
  launch 50 manual-placement max_steps=5
  launch 50 fsdp2-mlp max_steps=20
}

what_is_kept() {  # the blocks a loop that keeps nothing holds from its first steps, and where they were made
  for args in "" "--amp" "--conv" "--conv --amp"; do
    step 40 "what is kept $args" python3 gpu/scenarios/what_is_kept.py $args
  done
}

oom_recheck() { step 40 "outside pytorch, OOM" python3 gpu/scenarios/outside_pytorch.py --outside-gib 128 --ask-gib 16; }

kept_places() {  # where the few MiB the FSDP1 and DDP presets keep from earlier steps were made (the split's kept_at)
  launch 60 fsdp-not-sharding max_steps=5
  launch 50 ddp-baseline max_steps=5
  for run in $( [ -d "$SHARDTOP_RUNS_DIR" ] && ls -d "$SHARDTOP_RUNS_DIR"/*/ ); do
    python3 -m shardtop report "$run" --format json | python3 -c "import json, sys; d = json.load(sys.stdin)
for r in d['ranks']: print(d['run']['id'], 'rank', r['rank'], json.dumps((r.get('memory_peak') or {}).get('kept_at')))"
  done
}

script_tensors() {  # the fragmentation script's own tensors (the split's "made by the script"); the small OOM again
  step 60 "fragmentation" python3 gpu/scenarios/fragmentation.py
  step 60 "fragmentation, expandable segments" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 gpu/scenarios/fragmentation.py
  oom_recheck
}

split_rechecks() {  # the small OOM's peak (a second cuBLAS workspace) and Lightning ZeRO-3 rehearsed (its linear's backward)
  step 40 "outside pytorch, OOM" python3 gpu/scenarios/outside_pytorch.py --outside-gib 128 --ask-gib 16
  rehearse 80 devices=8 rank=0,last -- python3 gpu/scenarios/lightning_deepspeed_user.py --devices 8 --layers 4 --steps 3
}

scenarios1() {
  step 60 "fragmentation" python3 gpu/scenarios/fragmentation.py
  step 60 "fragmentation, expandable segments" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 gpu/scenarios/fragmentation.py
  step 60 "outside pytorch" python3 gpu/scenarios/outside_pytorch.py --outside-gib 6
  step 60 "outside pytorch, OOM" python3 gpu/scenarios/outside_pytorch.py --outside-gib 128 --ask-gib 16
}

scenarios2() {
  step 90 "wrong GPU" python3 -m shardtop run --headless --name wrong-gpu -- torchrun --standalone --nproc_per_node 2 gpu/scenarios/wrong_gpu.py
  step 90 "device set first" python3 -m shardtop run --headless --name device-set-first -- torchrun --standalone --nproc_per_node 2 gpu/scenarios/wrong_gpu.py --set-device-first
}

own() {
  local n; n=$(nvidia-smi -L | wc -l)
  step 200 "a user's Lightning DeepSpeed script" python3 -m shardtop run --headless --name lightning-deepspeed -- python3 gpu/scenarios/lightning_deepspeed_user.py --devices "$n"
}

planned_run() {  # seconds, a name, then a user's command: `shardtop plan -- CMD` first, then `shardtop run`
  local s=$1 name=$2; shift 2
  mkdir -p "$PLANS"
  step 90 "shardtop plan -- $name" sh -c 'python3 -m shardtop plan --format json -- "$@" > "$0" 2>"$0.err"' \
    "$PLANS/$name.json" "$@"
  step "$s" "shardtop run $name" python3 -m shardtop run --headless --name "$name" -- "$@"
}

clients() {  # the clients people use, a model of 167 M parameters, under `shardtop run` on one GPU
  local s=tests/own_scripts
  export HF_TINY_SIZE=gpu
  planned_run 120 hf-trainer-zero3 torchrun --standalone --nproc_per_node 1 $s/hf_trainer.py --cuda --deepspeed $s/ds_zero3.json --steps 5
  planned_run 120 hf-trainer-fsdp torchrun --standalone --nproc_per_node 1 $s/hf_trainer.py --cuda --fsdp "full_shard auto_wrap" --steps 5
  planned_run 120 accelerate-fsdp2 accelerate launch --config_file $s/accelerate_fsdp2.yaml --num_processes 1 $s/accelerate_train.py --cuda --steps 5
  planned_run 120 accelerate-zero3 accelerate launch --config_file $s/accelerate_zero3.yaml --num_processes 1 $s/accelerate_train.py --cuda --steps 5
  planned_run 120 peft-lora-fsdp2 accelerate launch --config_file $s/accelerate_fsdp2.yaml --num_processes 1 $s/accelerate_train.py --cuda --lora --steps 5
  planned_run 120 peft-lora-zero3 torchrun --standalone --nproc_per_node 1 $s/hf_trainer.py --cuda --deepspeed $s/ds_zero3.json --lora --steps 5
  unset HF_TINY_SIZE
  planned_run 120 compile-fsdp2 torchrun --standalone --nproc_per_node 1 $s/fsdp2_train.py --cuda --compile --dim 2048 --steps 5
  planned_run 120 lightning-bf16-true python3 gpu/scenarios/lightning_deepspeed_user.py --strategy fsdp --precision bf16-true --steps 5
}

plan_only() {  # seconds, a name, then a user's command: `shardtop plan -- CMD` alone
  local s=$1 name=$2; shift 2
  mkdir -p "$PLANS"
  step "$s" "shardtop plan -- $name" sh -c 'python3 -m shardtop plan --format json -- "$@" > "$0" 2>"$0.err"' \
    "$PLANS/$name.json" "$@"
}

client_plans() {  # the plans of the clients' runs alone (see clients)
  local s=tests/own_scripts
  export HF_TINY_SIZE=gpu
  plan_only 60 hf-trainer-zero3 torchrun --standalone --nproc_per_node 1 $s/hf_trainer.py --cuda --deepspeed $s/ds_zero3.json --steps 5
  plan_only 60 hf-trainer-fsdp torchrun --standalone --nproc_per_node 1 $s/hf_trainer.py --cuda --fsdp "full_shard auto_wrap" --steps 5
  plan_only 60 accelerate-fsdp2 accelerate launch --config_file $s/accelerate_fsdp2.yaml --num_processes 1 $s/accelerate_train.py --cuda --steps 5
  plan_only 60 accelerate-zero3 accelerate launch --config_file $s/accelerate_zero3.yaml --num_processes 1 $s/accelerate_train.py --cuda --steps 5
  plan_only 60 peft-lora-fsdp2 accelerate launch --config_file $s/accelerate_fsdp2.yaml --num_processes 1 $s/accelerate_train.py --cuda --lora --steps 5
  plan_only 60 peft-lora-zero3 torchrun --standalone --nproc_per_node 1 $s/hf_trainer.py --cuda --deepspeed $s/ds_zero3.json --lora --steps 5
  unset HF_TINY_SIZE
  plan_only 60 lightning-bf16-true python3 gpu/scenarios/lightning_deepspeed_user.py --strategy fsdp --precision bf16-true --steps 5
}

compiled() {
  planned_run 120 compile-fsdp2 torchrun --standalone --nproc_per_node 1 tests/own_scripts/fsdp2_train.py --cuda --compile --dim 2048 --steps 5
}

rehearse_story2_two() { rehearse 330 zero3-linear-fixed devices=2 rank=all model.n_layers=2000 gpu_mem_limit=$CAP max_steps=3; }

story2_fixed_six() { rehearse 300 zero3-linear-fixed devices=6 gpu_mem_limit=$CAP max_steps=3; }

over_time() {  # memory that grows: a loop keeping its logits under a 24 GiB cap; the small recordings again
  step 120 "kept logits" python3 -m shardtop run --headless --name kept-logits -- python3 gpu/scenarios/kept_logits.py --cap-gib 24
  step 60 "outside pytorch" python3 gpu/scenarios/outside_pytorch.py --outside-gib 6
  launch 60 manual-placement max_steps=5
}

oom_stories() {  # OOMs that sharding does not fix, each beside a run that comes close without it
  local keeps="tests/own_scripts/eval_keeps_graphs.py --cuda --cap-gib 20 --dim 2048 --hidden 8192 --vocab 32000 --tokens 4096 --batches 20"
  step 90 "outputs kept with their graphs" python3 -m shardtop run --headless --name eval-keeps-graphs -- python3 $keeps
  step 90 "outputs kept, evaluated under no_grad" python3 -m shardtop run --headless --name eval-no-grad -- python3 $keeps --no-grad
  local vocab="tests/own_scripts/large_vocab_loss.py --cuda --cap-gib 20 --seq 2048 --dim 1024"
  step 90 "logits of a 256k vocabulary" python3 -m shardtop run --headless --name large-vocab -- python3 $vocab --vocab 256000
  step 90 "logits of a 32k vocabulary" python3 -m shardtop run --headless --name small-vocab -- python3 $vocab --vocab 32000
}

fit() { fit_story2; fit_hf; }  # (BUDGET_S=1800 gpu/record.sh fit) shardtop fit on one GPU; every rehearsal is a run,
# fit's result is fits/*/fit.json in the runs dir
fit_story2() {  # story 2 fixed at six 16 GiB GPUs (the preset has no offload key: fit says which strategy the plan gives
  # a batch to)
  local minutes=${FIT_BUDGET:-20m}
  step $(( ${minutes%m} * 60 + 60 )) "fit story 2 fixed, six 16 GiB GPUs" python3 -m shardtop fit zero3-linear-fixed \
    devices=6 gpu=16GiB budget=$minutes
}
fit_hf() {  # an HF Trainer FSDP2 Llama of about 1 B parameters at eight 80 GiB GPUs, activation checkpointing off and
  # on (FIT_BUDGET: fit's own budget, 24m by default)
  local minutes=${FIT_BUDGET:-24m}
  step $(( ${minutes%m} * 60 + 60 )) "fit an HF Trainer FSDP2 Llama of 1 B parameters, eight 80 GiB GPUs" \
    python3 -m shardtop fit devices=8 gpu=A100-80GB budget=$minutes -- torchrun --nproc_per_node 8 \
    tests/own_scripts/fit_hf_trainer.py --output_dir /tmp/fit-hf-llama --report_to none --save_strategy no --bf16 \
    --fsdp "full_shard auto_wrap" \
    --fsdp_config '{"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}' \
    --per_device_train_batch_size 4 --max_steps 2 --vocab 32000 --hidden 2048 --layers 16 --heads 16 --seq 2048
}

trl_zero3() {  # TRL's SFTTrainer under accelerate launch with TRL's own zero3.yaml (bf16): alone, under shardtop run,
  # rehearsed as ranks 0 and 7 of eight, and planned at eight.  Wheels of trl, datasets, dill, multiprocess and fsspec
  # in .whl-trl/ (carried), installed in a folder named site-packages: dill pickles a module by reference only from
  # there, and datasets fingerprints each map function with it
  local config sft="tests/frameworks/trl_sft.py --cuda"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/trl/site-packages \
    .whl-trl/*.whl || return
  export PYTHONPATH=/tmp/trl/site-packages:$PYTHONPATH
  python3 -c "import sys, trl, datasets, pyarrow; print('trl', trl.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"
  config=$(python3 -c "import os, trl; print(os.path.join(os.path.dirname(trl.__file__), 'accelerate_configs', 'zero3.yaml'))")
  step 150 "TRL zero3 alone" accelerate launch --config_file "$config" --num_processes 1 $sft
  step 150 "TRL zero3 under shardtop run" python3 -m shardtop run --headless --name trl-zero3 -- accelerate launch \
    --config_file "$config" --num_processes 1 $sft
  rehearse 240 devices=8 rank=0,last -- accelerate launch --config_file "$config" --num_processes 8 $sft
  step 120 "TRL zero3 planned at eight" python3 -m shardtop plan devices=8 --format json -- accelerate launch \
    --config_file "$config" --num_processes 8 $sft
}

torchtitan_debug() {  # torchtitan's llama3 debug model (FSDP2 over the ranks), torchtitan's own trainer unchanged:
  # alone on one GPU, under shardtop run, rehearsed as ranks 0 and 7 of eight, planned at eight.  Wheels of torchtitan and
  # what it imports in .whl-titan/ (carried), datasets' in .whl-trl/; the tokenizer and text are made here
  local inputs=/tmp/titan-inputs
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/titan/site-packages \
    .whl-titan/*.whl .whl-trl/*.whl || return
  export PYTHONPATH=/tmp/titan/site-packages:$PYTHONPATH
  python3 -c "import torch, torchtitan; print('torchtitan', torchtitan.__version__ if hasattr(torchtitan, '__version__') else '?', 'torch', torch.__version__)"
  python3 tests/frameworks/torchtitan_inputs.py prepare $inputs || return
  titan() {  # processes, tag, then more options
    local n=$1 tag=$2; shift 2
    echo torchrun --nproc_per_node "$n" -m torchtitan.train --module llama3 --config llama3_debugmodel \
      --hf-assets-path $inputs/tokenizer --dataloader.dataset-path $inputs/data --training.steps ${TITAN_STEPS:-10} \
      --training.local-batch-size 8 --training.seq-len 2048 --training.global-batch-size $((8 * n)) \
      --checkpoint.no-enable --validator.no-enable --debug.seed 0 --metrics.disable-color-printing \
      --dump-folder /tmp/titan-out-$tag "$@"
  }
  step 120 "torchtitan debug model alone" $(titan 1 alone)
  step 120 "torchtitan debug model under shardtop run" python3 -m shardtop run --headless --name torchtitan-debug -- \
    $(titan 1 run)
  rehearse 240 devices=8 rank=0,last -- $(titan 8 rehearse)
  step 120 "torchtitan debug model planned at eight" python3 -m shardtop plan devices=8 --format json -- $(titan 8 plan)
}

probe_cost() { step 150 "probe cost" python3 bench/bench_probe.py --device cuda --profile 25; }
clients_cost() {  # what shardtop run costs real clients, fixed and per step (CLIENTS=hf,zero3,plain; CLIENT_S: each one's time)
  step 580 "clients alone and under shardtop run" python3 bench/bench_clients.py --device cuda --pairs ${PAIRS:-5} \
    --short ${SHORT:-50} --long ${LONG:-500} --clients "${CLIENTS:-hf,zero3,plain}" --budget "${CLIENT_S:-0}"
}
probe_profile() {  # where the probe's time goes on a GPU: each client under cProfile, under shardtop run, 500 steps
  local top="import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats('shardtop', 25)"
  step 120 "plain under cProfile" python3 -m shardtop run --headless --name prof-plain -- python3 -m cProfile \
    -o "$OUT/plain.prof" tests/own_scripts/large_vocab_loss.py --cuda --vocab 32000 --seq 512 --dim 512 --steps 500
  [ -f "$OUT/plain.prof" ] && python3 -c "$top" "$OUT/plain.prof"
  step 150 "hf under cProfile" python3 -m shardtop run --headless --name prof-hf -- torchrun --standalone \
    --nproc_per_node 1 -m cProfile -o "$OUT/hf.prof" tests/own_scripts/hf_trainer.py --fsdp "full_shard auto_wrap" \
    --steps 500 --cuda
  [ -f "$OUT/hf.prof" ] && python3 -c "$top" "$OUT/hf.prof"
  step 150 "zero3 under cProfile" python3 -m shardtop run --headless --name prof-zero3 -- deepspeed --num_gpus 1 \
    --no_local_rank --module cProfile -o "$OUT/zero3.prof" tests/own_scripts/zero3_train.py --steps 500 --width 1024 --cuda
  [ -f "$OUT/zero3.prof" ] && python3 -c "$top" "$OUT/zero3.prof"
}
terminal() { step 150 "terminal traffic" python3 bench/bench_ssh.py --nvml real --seconds 15 --dump "$OUT/ssh-bytes"; }
benches() { probe_cost; terminal; }
startup() {  # where attach's first frame spends its time, and first frames beside nvitop; ALSO=DIR: another checkout too
  python3 -c "import sys; print('dont_write_bytecode:', sys.flags.dont_write_bytecode)"
  python3 -m compileall -q /tmp/site shardtop ${ALSO:+"$ALSO"} > /dev/null  # bytecode, as a pip install leaves it
  step 120 "start phases" python3 bench/start_phases.py --times 8 ${ALSO:+--also "$ALSO"}
  step 240 "first frames" python3 bench/first_frames.py --times 12 --nvml real ${ALSO:+--also "$ALSO"}
}

{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, lightning, deepspeed; print(sys.version.split()[0], torch.__version__, lightning.__version__, deepspeed.__version__)"
  for part in "$@"; do "$part"; done
  for run in $( [ -d "$SHARDTOP_RUNS_DIR" ] && ls -d "$SHARDTOP_RUNS_DIR"/*/ ); do
    [ -f "$run/report.md" ] && continue
    timeout "$(left 20)" python3 -m shardtop report "$run" --format markdown > "$run/report.md" 2>&1
  done
  python3 -m shardtop runs --limit 0
} 2>&1 | tee -a "$OUT/gpu.log"
if [ -d "$SHARDTOP_RUNS_DIR" ]; then
  tar czf "$OUT/gpu-runs.tgz" -C "$(dirname "$SHARDTOP_RUNS_DIR")" "$(basename "$SHARDTOP_RUNS_DIR")" \
    $( [ -d "$PLANS" ] && echo "$(basename "$PLANS")")
fi
