"""The software published runs train on, as the planner's settings: which value of each stack setting
(STACK_SETTINGS below, the Workload fields that say how the software runs the layer) one stack fixes.

What each value means, and the code or paper it comes from, is in the field's docstring (workload.py);
this table only says which stack runs which. `shoal plan --stack NAME` starts from an entry and a flag
given beside it wins; without --stack, --emit or --gpu local take `shoal` (a recipe is what shoal train runs,
and Workload.of_job checks a job with the same entry), a GPU layout pinned to ZeRO-3 takes the FSDP programs'
entry (default_stack), and any other plan the Workload's defaults (the most common choice among published
stacks).
"""

from __future__ import annotations

STACK_SETTINGS = ("attention", "fp8_saves", "weight_gather", "grad_accumulation", "moe_dispatch", "moe_probs", "loss",
                  "adam_moments", "grad_overlap", "pp_p2p", "grad_reduce", "fp8_gather", "pp_overlap", "zero3_impl",
                  "cp_comm", "offload_overlap", "ep_overlap")
"""The Workload fields that say how a piece of software runs the layer: each a `shoal plan` flag, and what
--stack fills when the flag is not given (render.py reports them with --json)."""

STACKS: dict[str, dict[str, object]] = {
    # shoal train: SDPA's fused kernels, torchao's Float8Linear under plain ColwiseParallel (16-bit gathers),
    # FSDP2 over the fp32 weights reducing fp32 gradients under every precision, autograd's accumulation, its own
    # MoE layer and its all-to-all, each waited for where it is sent, its context parallelism's gathers, save_on_cpu's
    # activation copies on the compute stream (parallel/, model/moe.py).
    "shoal": dict(attention="flash", fp8_saves="input", weight_gather="fp32", grad_accumulation="separate",
                  moe_dispatch="per-expert", moe_probs="output", cp_comm="all-gather", fp8_gather="none",
                  offload_overlap=False, grad_reduce="fp32", ep_overlap="off"),
    # Megatron-Core with Transformer Engine as Megatron-Bridge's recipes and performance scripts set it up
    # (TE's cuDNN attention, FP8 GEMMs saving their FP8 inputs, the alltoall dispatcher, SwiGLU-weighted
    # experts, cross_entropy_fusion_impl "te", bf16 weights gathered by the distributed optimizer, gradients
    # accumulated in the GEMM and reduced in bf16, FP8 weights and activations gathered in FP8, interleaved
    # pipelines' transfers beside the compute).
    "megatron-bridge": dict(attention="flash", fp8_saves="fp8", weight_gather="bf16", grad_accumulation="fused",
                            moe_dispatch="per-expert", moe_probs="activation", loss="te", grad_reduce="bf16",
                            fp8_gather="all", pp_overlap=True),
    # torchtitan: SDPA's default FlashAttention-2 backend, torchao's Float8Linear, FSDP2 gathering bf16
    # (param_dtype bfloat16), PyTorch's context_parallel with its all-gather rotation. (SDPA's default is the
    # PyTorch of the published runs, 2024-25: torch 2.13 puts cuDNN first on sm90/sm100 with cuDNN >= 9.15.1,
    # sdp_utils.cpp check_prefer_cudnn_attention, where 2.9 still put FlashAttention-2 first; plan a run on such
    # a PyTorch with --attention flash.)
    "torchtitan": dict(attention="flash2", fp8_saves="input", weight_gather="bf16", cp_comm="torch-ring"),
    # Megatron-LM of 2021-22 (Narayanan et al. 2021): attention without flash kernels, its DDP hook's
    # accumulation, the gradient reduction after the last backward.
    "megatron-lm-2021": dict(attention="unfused", grad_overlap=False, grad_accumulation="separate"),
    # Megatron-DeepSpeed (MT-NLG, BLOOM, GPT-NeoX, GLM-130B): the same, pipelined by DeepSpeed's engine with
    # its blocking transfers.
    "megatron-deepspeed": dict(attention="unfused", grad_overlap=False, grad_accumulation="separate",
                               pp_p2p="blocking"),
}


def default_stack(xla: bool, zero: int | None) -> str | None:
    """The stack a plan takes when --stack is not given (and it plans neither shoal train nor a recipe).

    A GPU layout pinned to ZeRO-3 is a PyTorch FSDP program: torchtitan, llm-foundry (Composer), OLMo and
    Hugging Face Accelerate all shard with torch FSDP, and all attend with FlashAttention-2 (the flash-attn
    package, or SDPA's default flash backend), which is what moves such a plan most (compute.attention_rate):
    it takes torchtitan's entry. Megatron-Core's own FSDP is the exception; name its stack for it. XLA shards
    with GSPMD whatever the layout, and every other layout keeps the Workload's defaults: Megatron-Core's
    choices, the most common among published runs of TP, PP and ZeRO-1."""
    return "torchtitan" if zero == 3 and not xla else None


DEFAULT_STACK_NOTE = ("ZeRO-3 pinned on a GPU plans a PyTorch FSDP program (torchtitan's stack settings: "
                      "FlashAttention-2, torchao's FP8, PyTorch's context parallel); name the software with --stack")
"""What `shoal plan` prints when default_stack chose the stack."""


def stack_settings(stack: str | None, given: dict[str, object]) -> dict[str, object]:
    """The Workload's stack fields for a plan: the named stack's values, then the ones given (None: not given)."""
    settings = dict(STACKS[stack]) if stack else {}
    settings.update({name: value for name, value in given.items() if value is not None})
    return settings
