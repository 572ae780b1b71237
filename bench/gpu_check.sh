#!/usr/bin/env bash
# Everything a lent GPU is for, in one call (a lease is minutes): the device, the kernel rates the planner's
# catalog stands on, the CUDA/NCCL tests, the ~1B Llama's MFU beside the planner (bf16, FP8, activation
# offload), and the checkpoint stall. Each part has its own
# time limit so one slow part cannot take the others' output with it; logs go to $OUT (or ./gpu-check).
#
#     bash bench/gpu_check.sh                    # on the GPU machine, from the repository root
#     PARTS="checkpoint train" bash bench/gpu_check.sh   # some parts only
#
# It uses the machine's python3 and torch as they are (no install): shoal's own needs (rich,
# matplotlib, safetensors, tokenizers, pytest-timeout) are in common CUDA images.
set -u
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TORCH_CPP_LOG_LEVEL=ERROR
py=${PYTHON:-python3}

parts=" ${PARTS:-kernels cuda_tests gpu_mfu checkpoint train fp8 offload moe} "

part() {  # part NAME SECONDS COMMAND...: run with a limit, keep the whole log, say how it ended
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    [[ $parts == *" ${name%%_[0-9]*} "* ]] || return 0
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    grep -v -E '^W[0-9]{4} |torch/_logging|^\s*$' "$out/$name.log" | tail -n "${TAIL:-25}"
    echo "== $name: exit $rc after $((SECONDS - t0))s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv | tee "$out/device.txt"
"$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
  "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name())' | tee -a "$out/device.txt"

TAIL=20 part kernels 170 "$py" bench/gpu_kernels.py --json "$out/kernels.json" ${KERNEL_PARTS:+--parts $KERNEL_PARTS}
TAIL=12 part cuda_tests 150 "$py" -m pytest -m cuda tests/cuda -p no:cacheprovider -q -rs
TAIL=40 part gpu_mfu 300 "$py" bench/gpu_mfu.py --steps 6 --warmup 2 --max-micro-batch 16 --profile --json "$out/gpu_mfu.json"
TAIL=8 part checkpoint 75 "$py" bench/bench_checkpoint.py
TAIL=8 part checkpoint_2gb 100 "$py" bench/bench_checkpoint.py --dim 1536 --layers 8 --repeats 2

# shoal train itself on the ~1B shape (byte-level stdlib text in the llama3 vocabulary): its summary
# puts the planner's prediction for this device beside the measured step time, MFU and peak memory.
# fp8: the same compiled run with torchao's FP8 linears; offload: eager, activations kept in pinned host memory.
llama_1b=(model.preset=llama3-8b model.dim=2048 model.n_layers=16 model.n_heads=32 model.n_kv_heads=8
          model.ffn_hidden=8192 model.tie_embeddings=true train.seq_len=4096 train.micro_batch=8 train.global_batch=8
          train.steps=${STEPS:-30} train.warmup_steps=5 train.precision=bf16 train.compile=true train.eval_every=0
          train.eval_batches=2 train.sample_tokens=0)
train() {  # train NAME LIMIT OVERRIDES...: shoal train on the 1B shape (its log holds the summary)
    local name=$1 limit=$2 run
    shift 2
    run=$(mktemp -d)/run
    TAIL=45 part "$name" "$limit" "$py" -m shoal train --out "$run" "${llama_1b[@]/#/--set=}" "${@/#/--set=}"
    cp "$run/profile/rank0.summary.json" "$out/$name.profile.json" 2>/dev/null
    rm -rf "$(dirname "$run")"
}
train train 200
train fp8 240 train.precision=fp8
# Two sequences a step: the host keeps every layer's saved activations in pinned memory (~6 GiB a sequence).
train offload 120 train.compile=false train.activation_offload=true train.micro_batch=2 train.global_batch=2
# Fine-grained MoE (Qwen3-30B-A3B's layer: 128 experts of 768, top 8, dim 2048), 4 layers, eager, with a
# profile of steps 6-7: how much of the step the device waits on the host (the routing's host sync, a
# matmul launch per expert), beside the planner's prediction.
train moe 150 train.compile=false train.micro_batch=2 train.global_batch=2 train.steps=8 debug.profile_steps=6-7 \
    model.n_layers=4 model.n_kv_heads=4 model.head_dim=128 model.n_experts=128 model.top_k=8 model.expert_ffn_hidden=768
