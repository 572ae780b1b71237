"""What is being planned: the workload (model + batch) and the cluster. The layout and its rules
are the trainer's own (shoal/layout.py), imported here so the planner speaks its vocabulary.

The rank grid is laid out with tp innermost, then dp, then pp outermost (torchtitan's
[pp, dp, tp] order), so a TP group is tp consecutive ranks (inside one node when tp <= gpus per
node), a DP or EP group strides over tp, and a PP group strides over tp * dp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from shoal.errors import UserError
from shoal.layout import MAX_GPUS
from shoal.model import analytics
from shoal.model.config import ModelConfig
from shoal.hardware.gpu import GPU

PRECISIONS = ("bf16", "fp32", "fp8", "fp16")
ATTENTION = ("flash", "flash2", "unfused")
KERNELS = ("fused", "eager")
MOE_DISPATCH = ("dedup", "dedup-bf16", "per-expert")
MOE_PROBS = analytics.MOE_PROBS
LOSSES = ("fp32", "te", "megatron")
ADAM_MOMENTS = ("fp32", "bf16")
FP8_SAVES = ("fp8", "input")
WEIGHT_GATHERS = ("bf16", "fp32")
PP_P2P = ("batched", "blocking")
GRAD_ACCUMULATION = ("fused", "separate")
GRAD_REDUCES = ("auto", "fp32", "bf16")
FP8_GATHERS = ("none", "activations", "all")
ZERO3_IMPLS = ("fsdp", "deepspeed-2021")
CP_COMMS = ("p2p", "all-gather", "torch-ring", "a2a")
EP_OVERLAPS = ("auto", "on", "off")


@dataclass(frozen=True)
class Workload:
    model: ModelConfig
    """The model (a preset or a shape), from shoal.model.config."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    precision: str = "bf16"
    """`bf16` mixed precision (fp32 master weights and Adam state), plain `fp32`, or `fp8`: bf16 mixed
    precision with the layers' GEMMs in FP8 (Transformer Engine's recipe; shoal train's through torchao). The trainer's
    `bf16-params` plans as `bf16`: both compute in 16 bits over fp32 master state. `fp16` plans as bf16 (same
    tensor-core rate, same 2+2+12 bytes of state) plus its dynamic loss scaler, one fp32 scalar."""
    fp8_saves: str = "fp8"
    """precision=fp8: what each FP8 GEMM keeps of its input for the weight gradient. `fp8`: the 1-byte cast it
    multiplied (Transformer Engine's Linear and GroupedLinear save their quantized input, Megatron-Core FP8 runs;
    DeepSeek-V3 §3.3.2 caches its Linear inputs in FP8). `input`: the 16-bit input, cast again in backward
    (torchao's Float8Linear: matmul_with_hp_or_float8_args saves input_hp, pytorch/ao#1850), which is what
    `shoal train` runs (its routed experts stay 16-bit GEMMs too)."""
    weight_gather: str = "bf16"
    """The dtype sharded weights are gathered in (ZeRO-3's per-layer all-gathers, ZeRO-1/2's re-gather of the
    updated weights) and held while gathered. `bf16`: the 16-bit copy, as torchtitan (FSDP2 param_dtype bf16),
    Megatron-Core's distributed optimizer and DeepSpeed gather them. `fp32`: the fp32 weights themselves, cast
    by autocast per op: shoal train under bf16, fp8 and fp16 (FSDP2 with no param_dtype, and ZeRO-1's
    broadcast of the fp32 weights it updated: parallel/data_parallel.py, zero1.py); bf16-params gathers bf16.
    Twice the bytes on the wire and in the gathered layers."""
    kernels: str = "fused"
    """`fused`: the layer's norms, activation and loss run as fused kernels, as Megatron-Core/Transformer
    Engine, torch.compile and XLA run them: a norm saves only its input (memory.py, analytics.py). `eager`:
    one PyTorch op per kernel, as `shoal train` runs without train.compile (its measured saved tensors)."""
    moe_dispatch: str = "dedup"
    """How the expert all-to-all sends a token (timing._ep_comm). `dedup`: once to each ep rank that holds one of
    its experts, and in FP8 under fp8 (DeepEP's dispatch; DeepSeek-V3 §3.3.2). `dedup-bf16`: once a rank too, but
    in 16 bits under fp8 as well: Megatron-Core's `flex` dispatcher, which runs DeepEP or HybridEP with FP8
    dispatch off (moe/fused_a2a.py at d98e8a64: "we do not support fp8 dispatch", and HybridEP asserts it off),
    as Megatron-Bridge's recipes set it with moe_flex_dispatcher_backend. `per-expert`: one copy per chosen
    expert in the activations' precision (bf16 under fp8 too), permuted before the exchange: Megatron-Core's `alltoall` dispatcher (moe/token_dispatcher.py,
    MoEAlltoAllTokenDispatcher.preprocess: num_out_tokens = tokens x topk), the default moe_token_dispatcher_type
    of Megatron-Bridge's Qwen3, GPT-OSS and DeepSeek providers, and shoal train's (parallel/expert_parallel.py
    sends the tokens sorted by expert)."""
    adam_moments: str = "fp32"
    """The dtype of Adam's two moments (memory.model_state_bytes): `fp32` (the ZeRO paper's K = 12 with the fp32
    master weights), or `bf16` (K = 8): DeepSeek-V3 §3.3.3 tracks them in BF16, and Megatron-Bridge's DeepSeek-V3
    recipe sets use_precision_aware_optimizer with exp_avg_dtype = exp_avg_sq_dtype = bfloat16 (recipes/deepseek/
    deepseek_v3.py at 00b7660b). Memory only: the optimizer step's time is planned as with fp32 moments."""
    loss: str = "fp32"
    """kernels=fused: the fused cross-entropy, which decides what the last stage holds per logit
    (memory.loss_bytes_per_logit). `fp32`: the fp32 logits and their gradient, 8 bytes. `te`: Transformer Engine's
    parallel_cross_entropy (Megatron-Core's cross_entropy_fusion_impl="te", set by Megatron-Bridge's Llama, Qwen3
    and DeepSeek recipes) writes the gradient over the 16-bit logits in forward (triton/cross_entropy.py) and keeps
    only them, 2 bytes. `megatron`: Megatron-Core's own fused loss (cross_entropy_fusion_impl="native", its
    default), the fp32 exp(logits) and a 16-bit copy of their gradient, 6 bytes."""
    moe_probs: str = "activation"
    """Where an MoE layer multiplies each expert's output by its routing weight, which decides what its combine
    keeps for backward (analytics.moe_combine_elements). `activation`: inside the expert's activation, before the
    down-projection (Megatron-Core's TEGroupedMLP, weighted_bias_swiglu_impl), so the combine keeps no h-wide
    tensor. `output`: after the down-projection, keeping each copy's output (shoal train's MoE.forward, and
    eager its index_add_'s source too)."""
    attention: str = "flash"
    """`flash`: fused attention that keeps no S×S matrix, the device's own kernel (what shoal runs: cuDNN's
    on Hopper and newer, as Transformer Engine does; FlashAttention-2 on Ampere). `flash2`: FlashAttention-2
    on any device, PyTorch SDPA's default backend (torchtitan, llm-foundry), slower on Hopper. `unfused`: the
    S×S scores, softmax and dropout are materialised, as in Megatron-LM before flash attention (Korthikanti's
    Table 2 layer); use it to compare with runs from 2021-2022."""
    document_mask: bool = False
    """data.document_mask: packed documents attend only within themselves, through an explicit mask that
    SDPA makes additive and keeps for backward in every layer (memory.py), and that stops the fused kernel
    from skipping the causal half (compute.MASKED_ATTENTION_SHARE)."""
    grad_overlap: bool = True
    """Whether the once-per-step gradient reduction runs beside the backward (bucket by bucket) and the
    parameter all-gather beside the next forward: PyTorch DDP, FSDP, shoal train, Megatron-Core with
    --overlap-grad-reduce --overlap-param-gather. False: both run after the last backward, on the critical
    path, as Megatron-LM did until those flags existed (megatron/training.py train_step at 285068c8, January
    2023: reduce_model_grads, then the optimizer step, then gather_model_params) and as DeepSpeed's pipeline
    engine does (runtime/pipe/schedule.py TrainSchedule: ReduceTiedGrads, ReduceGrads, OptimizerStep after the
    last step). Use it to compare with runs on those stacks (MT-NLG, BLOOM, GPT-NeoX, Megatron-LM of 2021-23)."""
    grad_accumulation: str = "fused"
    """How a micro-batch's weight gradients join the ones accumulated over the step (timing._Kernels.accumulate).
    `fused`: inside the weight-gradient GEMM, which writes into the accumulator (Megatron-Core's
    gradient_accumulation_fusion, Transformer Engine's fuse_wgrad_accumulation), or sharded as FSDP reduces every
    micro-batch: nothing more. `separate`: a kernel of its own adds each new 16-bit gradient into the
    accumulated one, a pass over the GPU's parameters per micro-batch (read the new gradient, read and write the
    sum: 3 gradient-sized tensors): PyTorch autograd's AccumulateGrad, which DeepSpeed's pipeline engine leaves it
    to (its ZeRO-0/1 optimizer reduces once at the step's end: runtime/zero/stage2.py at 30965ea7, hooks only
    under partition_gradients or overlap_comm, and those run after the accumulation), and shoal train's
    no_sync / set_requires_gradient_sync(False); Megatron-LM's own DDP of 2021 hooks every gradient into its
    buffer, param.main_grad.add_(param.grad.data) (megatron/model/distributed.py at b4bc51b1)."""
    pp_p2p: str = "batched"
    """How pipeline stages exchange a micro-batch's activation and its gradient (timing._p2p). `batched`: a
    stage posts its send and its receive of a step together, and one transfer each way per micro-batch is on
    the critical path: torch.distributed.pipelining's schedules (shoal train) and Megatron-LM's
    send_forward_recv_backward both batch them with batch_isend_irecv. `blocking`: DeepSpeed's PipelineEngine
    (runtime/pipe/engine.py and p2p.py at 30965ea7, October 2021; the same since the engine came, 65c2f974,
    September 2020): every send and receive is a blocking call of its own, a middle stage runs four per
    micro-batch one after another (TrainSchedule: RecvActivation and SendGrad before the forward, SendActivation
    and RecvGrad before the backward), each a small metadata tensor and then the 1/tp slice, and every tensor
    it receives is put back whole by an all-gather over the TP group (PartitionedTensor.full: zeros, the
    gather, a clone) before it is used: the forward's input, and in backward the saved output and its
    gradient. Megatron-DeepSpeed's runs (MT-NLG, BLOOM, GLM-130B) and GPT-NeoX's (DeeperSpeed) run it."""
    grad_reduce: str = "auto"
    """The dtype gradients cross the data-parallel ranks in (data_parallel.grad_reduce_bytes). `auto`: fp32, except
    16 bits under fp16 mixed precision, where the stacks keep and reduce fp16 gradients: Megatron forces fp32
    accumulation and reduction for bf16 only (arguments.py: accumulate_allreduce_grads_in_fp32 under --bf16),
    DeepSpeed all-reduces its fp16 gradients (allreduce_always_fp32 off) and fairscale's FSDP reduce-scatters in
    fp16 (fp32_reduce_scatter off). `fp32`: shoal's
    FSDP2 policy (reduce_dtype=float32), torchtitan's default, Megatron's --accumulate-allreduce-grads-in-fp32 and
    Megatron-Bridge's MixedPrecisionConfig.grad_reduce_in_fp32 default, Apex's DistributedFusedAdam (NeMo 1.x:
    grad_sync_dtype defaults to its fp32 state dtype). `bf16`: half the bytes, as Megatron-Bridge's performance
    recipes set it (grad_reduce_in_fp32 = False in scripts/performance/configs/{llama,qwen,deepseek,gpt_oss}/
    *_llm_pretrain.py at 00b7660b). An XLA device reduces in the compute dtype whatever this says. Time only: the
    memory is planned as with fp32 (Megatron's bf16 gradient buffer would hold 2 bytes less per parameter)."""
    fp8_gather: str = "activations"
    """precision=fp8: which all-gathers move FP8 bytes instead of 16-bit ones (timing._tp_comm,
    data_parallel.DataParallel.gather). `none`: every gather in 16 bits, as shoal train runs FP8 (torchao's
    Float8Linear under plain ColwiseParallel and FSDP2). `activations` (the default: both FP8 libraries do it):
    under sequence parallelism the all-gathers in front of the column-parallel GEMMs, forward and backward, move
    the FP8 cast: Transformer Engine casts before it gathers (module/layernorm_linear.py at v1.8: the norm writes
    FP8, then gather_along_first_dim; module/base.py grad_output_preprocess casts the output gradient before its
    gather; at v2.8 distributed.py _all_gather_fp8 for delayed and current scaling alike), and so do torchao's
    Float8ColwiseParallel and PrepareFloat8ModuleInput, which torchtitan applies to every Float8Linear under TP
    (float8_tensor_parallel.py; torchtitan docs/float8.md: "float8 all-gather ... for TP (by default)"); the
    reduce-scatters stay 16-bit (GEMM outputs).
    `all`: the ZeRO weight gathers too, FP8 weights gathered once per step or per layer (Megatron-Core's
    fp8_param_gather, on in Megatron-Bridge's FP8 recipes: training/mixed_precision.py at 00b7660b,
    bf16_with_fp8_current_scaling_mixed and bf16_with_mxfp8_mixed). Time only: memory as with 16-bit gathers."""
    pp_overlap: bool = False
    """Whether an interleaved 1F1B pipeline's sends and receives run beside the chunk computed meanwhile (timing._p2p):
    Megatron's overlap_p2p_comm, which posts a chunk's isend/irecv and waits for them only before the chunk that
    needs them; Megatron-LM's command line turns it on for interleaved schedules (--no-overlap-p2p-communication
    turns it off), NeMo's launcher configs set it (conf/training/llama/llama2_70b.yaml, gpt3/175b.yaml) and
    Megatron-Bridge sets it wherever VP > 1 (training/comm_overlap.py at 00b7660b). False: each chunk's
    communication on the critical path, as torch.distributed.pipelining's schedules run it for shoal train
    (PipelineScheduleMulti waits for every time step's sends and receives before the next compute)."""
    offload_overlap: bool = True
    """With activation offload (layout.activation_offload): whether the copies to and from the host run on a
    stream of their own, beside the next layer's kernels (timing._offload_per_layer). True: Transformer Engine's
    CPU offload context, which Megatron-Core's cpu_offloading uses (transformer_engine/pytorch/cpu_offload.py at
    d0067d0d: OffloadableLayerState puts each device-to-host copy on offload_stream after an event, and the
    reload ahead of the layer's backward; transformer_block.py at d98e8a64). False: each copy on the compute
    stream where the tensor is saved, so the next kernel waits: torch.autograd.graph.save_on_cpu, which shoal
    train runs."""
    zero3_impl: str = "fsdp"
    """How ZeRO-3 gathers the weights and reduces the gradients. `fsdp`: a layer at a time, the next layer
    prefetched beside this one's kernels, gradients reduce-scattered in fp32 (FSDP2 as shoal train, torchtitan
    and llm-foundry run it; data_parallel.py). `deepspeed-2021`: DeepSpeed's ZeRO-3 of v0.3.13 (March 2021), one
    all_gather per weight into per-rank views, one module ahead, the host synchronising the device at each
    module, gradients all-reduced in fp16 buckets (planner/deepspeed_zero3.py); use it for runs on that stack
    (Narayanan et al. 2021's ZeRO-3 comparison)."""
    cp_comm: str = "p2p"
    """How context parallelism moves the keys and values (planner/context_parallel.py has the code each follows).
    `p2p`: Transformer Engine's ring, Megatron-Core's default, each step's send beside that step's attention.
    `all-gather`: shoal train's, K/V all-gathered before attention and again in backward, dK/dV reduce-scattered
    in fp32 after it, none of it beside compute. `torch-ring`: PyTorch's context_parallel with its default
    all-gather rotation as torchtitan ran it (torch 1963fc8, torchtitan 9dec370): one all-gather beside the first
    of cp attention calls, fp32 merges of their outputs, fp32 dK/dV passed round the ring in backward, on K/V
    repeated to the query heads (torchtitan's repeat_kv). `a2a`: Ulysses (Megatron-Core's cp_comm_type "a2a",
    DeepSpeed-Ulysses): Q, K, V and the output all-to-all'ed between sequence and heads around one attention call
    over the whole sequence, nothing beside compute; the heads on a tensor-parallel rank must divide by cp."""
    ep_overlap: str = "auto"
    """Whether one micro-batch's expert all-to-all runs beside another micro-batch's kernels (timing._ep_comm).
    `on`: wherever another is in flight, Megatron-Core's --overlap-moe-expert-parallel-comm (with
    --delay-wgrad-compute), which a recipe turns on or leaves off (the Megatron-MoE ModelZoo publishes one
    Qwen3-235B layout both ways). `off`: each exchange on the critical path, as shoal train and Megatron-Core's
    default run it. `auto`: `on` only where the expert group leaves the node, as the published recipes set it
    (timing._ep_comm names them). DualPipe's paired chunks overlap whatever this says: the schedule does it."""
    stack: str | None = None
    """The stacks.STACKS entry the settings above started from (None: each setting's own default), for the
    output to say which software the plan assumes."""
    grad_compression: str = "none"
    """parallel.grad_compression: scales the data-parallel gradient bytes (planner/slow_links.py)."""
    topk_density: float = 0.1
    powersgd_rank: int = 4
    diloco_inner_steps: int = 0
    """parallel.diloco_inner_steps: every data-parallel rank is its own replica group (zero=0) and
    all-reduces its parameters once every H steps instead of its gradients every step."""
    diloco_quantize: str = "none"
    diloco_overlap_steps: int = 0
    """parallel.diloco_overlap_steps: the parameters' all-reduce runs beside this many steps' kernels."""

    def __post_init__(self):
        if self.precision == "bf16-params":
            object.__setattr__(self, "precision", "bf16")

    @classmethod
    def of_job(cls, job) -> Workload:
        """What a `shoal train` job (shoal.job.Job) computes and sends: its model, batch, precision, how
        shoal's software runs it (stacks.STACKS["shoal"]; compiled or not, bf16-params gathering bf16), its
        document mask and its slow-link settings."""
        from dataclasses import asdict

        from shoal.planner.slow_links import slow_link_fields
        from shoal.planner.stacks import STACKS

        t = job.cfg.train
        settings = {**STACKS["shoal"], **({"weight_gather": "bf16"} if t.precision == "bf16-params" else {})}
        return cls(job.model, t.seq_len, t.global_batch, precision=t.precision,
                   kernels="fused" if t.compile else "eager", document_mask=job.cfg.data.document_mask,
                   **settings, stack="shoal", **slow_link_fields(asdict(job.cfg.parallel)))

    @property
    def gathered_weight_bytes(self) -> int:
        """Bytes per weight that an FSDP gather moves and holds (weight_gather; fp32 training gathers fp32)."""
        return 4 if "fp32" in (self.precision, self.weight_gather) else 2

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch




@dataclass(frozen=True)
class Cluster:
    gpu: GPU
    """The device and its links (hardware.py)."""
    n_gpus: int
    """Ranks in the job: dp * tp * cp * pp."""
    gpus_per_node: int
    """Usually gpu.gpus_per_node; `--gpus-per-node` changes it."""

    def __post_init__(self):
        if not 1 <= self.n_gpus <= MAX_GPUS:
            raise UserError("gpus", self.n_gpus, f"must be from 1 to {MAX_GPUS:,}")
        # Launchers, Slurm and Kubernetes start as many ranks on every node: a count that is not a whole
        # number of nodes runs on fewer GPUs of each (72 of NVL72 racks: 2 x 36; 1,024: 16 x 64), the most
        # that divide it evenly.
        n, per = self.n_gpus, self.gpus_per_node
        if n > per and n % per:
            object.__setattr__(self, "gpus_per_node", max(d for d in range(1, per + 1) if n % d == 0))

    @property
    def n_nodes(self) -> int:
        return math.ceil(self.n_gpus / self.gpus_per_node)


@lru_cache(maxsize=256)
def moe_layer_count(cfg: ModelConfig) -> int:
    """cfg.n_moe_layers, cached: it walks every layer and the search asks thousands of times."""
    return cfg.n_moe_layers


def group_ranks_per_node(size: int, stride: int, gpus_per_node: int) -> int:
    """How many members of a process group share a node, for a group of `size` ranks `stride` apart."""
    if size <= 1:
        return 1
    if stride >= gpus_per_node:
        return 1
    return max(1, min(size, gpus_per_node // stride))


def expert_grid(lay) -> tuple[int, int]:
    """(expert tensor-parallel size, expert data-parallel size) of a layout. ep inside dp_shard (shoal's
    layout): the experts are split tp ways like the dense layers and replicated over dp*cp/ep ranks. ep
    wider than dp_shard is Megatron-Core's MoE parallel folding (Liu et al. 2025, "MoE Parallel Folding"):
    the expert grid re-partitions the tp*cp*dp ranks, here with whole experts per rank (expert TP 1, as
    Megatron-Bridge's DeepSeek-V3 recipes run TP 2 with EP 64 on 32-way data parallelism). Either way, and for
    an expert_tp given (Megatron's ETP), the grid is expert_tp x ep x the rest (Layout.experts_split)."""
    etp = lay.experts_split
    return etp, max(1, lay.dp * lay.cp * lay.tp // (etp * max(1, lay.ep)))


def layers_per_rank(n_layers: int, pp: int, virtual: int) -> int:
    """Layers on the busiest pipeline rank: stages take ceil(L / (pp * v)) layers each."""
    return math.ceil(n_layers / (pp * virtual)) * virtual
