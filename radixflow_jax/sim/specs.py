"""Model and device specifications for the simulated executor (plain Python, no JAX).

Model sizes follow the models' published ``config.json`` values (docs/design.md,
"Workloads and model sizes"); device numbers are public datasheet peaks (dense bf16 FLOP/s, HBM bandwidth, memory).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Per-token costs of one model. ``attn``/``gdn``/``mamba`` count layers of each mixer."""

    name: str
    hidden: int
    vocab: int
    attn: int
    q_heads: int
    kv_heads: int
    head_dim: int
    gdn: int = 0
    gdn_k_heads: int = 0
    gdn_v_heads: int = 0
    gdn_k_dim: int = 128
    gdn_v_dim: int = 128
    mamba: int = 0
    mamba_heads: int = 0
    mamba_head_dim: int = 64
    mamba_state: int = 128
    mamba_groups: int = 8
    mlp_layers: int = 0  # layers with a dense MLP
    mlp_inter: int = 0
    mlp_mats: int = 3  # SwiGLU 3, squared-ReLU 2
    moe_layers: int = 0
    experts_active: int = 0
    expert_inter: int = 0
    shared_inter: int = 0
    total_experts: int = 0
    conv_kernel: int = 4
    dtype_bytes: int = 2
    gdn_chunk: int = 64  # chunked gated-delta kernel chunk (Qwen3-Next / Qwen3.5 use 64)
    mamba_chunk: int = 128  # chunked SSD kernel chunk (Nemotron-H config: chunk_size 128)

    @property
    def chunk_sizes(self) -> tuple[int, ...]:
        """The recurrent kernels' chunks (they set the checkpoint grid with the page size)."""
        return ((self.gdn_chunk,) if self.gdn else ()) + ((self.mamba_chunk,) if self.mamba else ())

    def _attn_params(self) -> int:
        return self.hidden * self.head_dim * (2 * self.q_heads + 2 * self.kv_heads)  # q (+gate) k v o

    def _gdn_params(self) -> int:
        kd, vd = self.gdn_k_heads * self.gdn_k_dim, self.gdn_v_heads * self.gdn_v_dim
        return self.hidden * (2 * kd + 2 * vd + 2 * self.gdn_v_heads) + vd * self.hidden

    def _mamba_params(self) -> int:
        inner = self.mamba_heads * self.mamba_head_dim
        conv = inner + 2 * self.mamba_groups * self.mamba_state
        return self.hidden * (inner + conv + self.mamba_heads) + inner * self.hidden

    @property
    def active_params(self) -> int:
        """Parameters touched per token (routed experts: only the active ones)."""
        mlp = self.mlp_layers * self.mlp_mats * self.hidden * self.mlp_inter
        moe = self.moe_layers * 3 * self.hidden * (self.experts_active * self.expert_inter + self.shared_inter)
        mixers = self.attn * self._attn_params() + self.gdn * self._gdn_params() + self.mamba * self._mamba_params()
        return mixers + mlp + moe + 2 * self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        extra = self.moe_layers * 3 * self.hidden * self.expert_inter * max(self.total_experts - self.experts_active, 0)
        return self.active_params + extra

    @property
    def kv_bytes_per_token(self) -> int:
        return self.attn * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def page_bytes(self, page_size: int) -> int:
        """One KV page over every attention layer (the pools' and the host link's unit)."""
        return self.kv_bytes_per_token * page_size

    @property
    def state_bytes(self) -> int:
        """One checkpoint: every recurrent layer's float32 state plus its conv state."""
        gdn = self.gdn_v_heads * self.gdn_k_dim * self.gdn_v_dim * 4
        gdn_conv = (self.conv_kernel - 1) * (2 * self.gdn_k_heads * self.gdn_k_dim + self.gdn_v_heads * self.gdn_v_dim)
        inner = self.mamba_heads * self.mamba_head_dim
        mamba = self.mamba_heads * self.mamba_head_dim * self.mamba_state * 4
        mamba_conv = (self.conv_kernel - 1) * (inner + 2 * self.mamba_groups * self.mamba_state)
        return self.gdn * (gdn + gdn_conv * self.dtype_bytes) + self.mamba * (mamba + mamba_conv * self.dtype_bytes)

    @property
    def recurrent_flops_per_token(self) -> int:
        gdn = 6 * self.gdn_v_heads * self.gdn_k_dim * self.gdn_v_dim
        mamba = 6 * self.mamba_heads * self.mamba_head_dim * self.mamba_state
        return self.gdn * gdn + self.mamba * mamba

    @property
    def is_hybrid(self) -> bool:
        return bool(self.gdn or self.mamba)


def _qwen35(name: str, hidden: int, layers: int, q: int, kv: int, v_heads: int, mlp: int, **kw: int) -> ModelSpec:
    """A Qwen3.5-style model: one attention layer in four, the others Gated DeltaNet."""
    attn = layers // 4
    return ModelSpec(
        name=name,
        hidden=hidden,
        vocab=248320,
        attn=attn,
        q_heads=q,
        kv_heads=kv,
        head_dim=256,
        gdn=layers - attn,
        gdn_k_heads=16,
        gdn_v_heads=v_heads,
        mlp_layers=layers if mlp else 0,
        mlp_inter=mlp,
        **kw,
    )


_MOE_35B = {"moe_layers": 40, "experts_active": 8, "expert_inter": 512, "shared_inter": 512, "total_experts": 256}
_MOE_80B = {**_MOE_35B, "moe_layers": 48, "experts_active": 10, "total_experts": 512}
MODEL_SPECS: dict[str, ModelSpec] = {
    "qwen3.5-4b": _qwen35("qwen3.5-4b", hidden=2560, layers=32, q=16, kv=4, v_heads=32, mlp=9216),
    "qwen3.5-9b": _qwen35("qwen3.5-9b", hidden=4096, layers=32, q=16, kv=4, v_heads=32, mlp=12288),
    "qwen3.5-27b": _qwen35("qwen3.5-27b", hidden=5120, layers=64, q=24, kv=4, v_heads=48, mlp=17408),
    "qwen3.5-35b-a3b": _qwen35("qwen3.5-35b-a3b", hidden=2048, layers=40, q=16, kv=2, v_heads=32, mlp=0, **_MOE_35B),
    "qwen3-next-80b-a3b": dataclasses.replace(
        _qwen35("qwen3-next-80b-a3b", hidden=2048, layers=48, q=16, kv=2, v_heads=32, mlp=0, **_MOE_80B),
        vocab=151936,
    ),
    "nemotron-h-8b": ModelSpec(
        name="nemotron-h-8b", hidden=4096, vocab=131072, attn=4, q_heads=32, kv_heads=8, head_dim=128,
        mamba=24, mamba_heads=128, mamba_head_dim=64, mamba_state=128, mamba_groups=8,
        mlp_layers=24, mlp_inter=21504, mlp_mats=2,
    ),
    "qwen3-8b": ModelSpec(
        name="qwen3-8b", hidden=4096, vocab=151936, attn=36, q_heads=32, kv_heads=8, head_dim=128,
        mlp_layers=36, mlp_inter=12288,
    ),
}


# Where the cost constants come from (no GPU of this project has measured them yet):
#  * ROUND_OVERHEAD_GRAPH_S: the fixed cost of a round whose device work is one compiled program.
#    Llama-3.1-8B decode step on one H100 SXM5: 5.1 ms captured as a CUDA graph, 8.4 ms eager
#    (https://cloudai.pt/tag/cuda-graphs/). Its weights (16.06 GB) take 4.79 ms at the 3.35 TB/s
#    peak, so the graph-captured step spends about 0.3 ms beyond the weight read; add this
#    project's own host work per round, plan + build 0.66 ms median at 64 running / 256 waiting
#    (docs/perf-log.md, `benchmarks/host_overhead.py`): about 1.0 ms.
#  * ROUND_OVERHEAD_EAGER_S: the same figure's eager - graph difference, 3.3 ms: the launch cost of
#    a step that is not one compiled program (the second value docs/results.md reports).
#  * MBU 0.7: the low end of the 70-85 % memory-bandwidth utilisation that tuned CUDA serving stacks
#    reach in decode (https://www.open-source-ai.tech/glossary/model-bandwidth-utilization; a rule of
#    thumb, not a measurement). MFU 0.5: an assumption (no public per-round prefill figure found);
#    the results state it, and it only matters for rounds that are compute-bound.
#  * KERNEL_LAUNCH_S (GPU): the device-side cost of one more kernel inside a compiled program, what
#    policy pair's pre-pass adds per recurrent layer (sim/pairing_cost.py). An assumption of the
#    order of the per-kernel gap in a CUDA graph (no figure of this project or a cited one yet;
#    benchmarks/gpu_check.py measures the fixed per-round cost when a GPU is lent).
#  * GRID_STEP_S (TPU): the fixed cost of one grid step of a Pallas TPU kernel, what the second
#    scan's steps add. An assumption of the same standing.
#    Both enter only rounds with paired consumers.
#  * SM_COUNT: H200 has 132 SMs (NVIDIA H100/H200 SXM datasheet); a GPU program (one row, head and
#    column block of the chunked scan) runs on one SM, so a serial chunk chain runs at 1/132 of peak.
#  * The host link (the host tier's spills and restores, sim/hostlink.py): H200 connects to its host
#    over PCIe Gen5 x16, 128 GB/s counting both directions (NVIDIA H200 datasheet), so 64 GB/s per
#    direction, the nominal peak (pinned-memory copies reach less; no measurement of this project
#    yet). HOST_LINK_LATENCY_S, the fixed cost of one copy, is an assumption of the order of a
#    CUDA copy launch. No TPU generation publishes its host link (the v5e / v6e pages list HBM, ICI
#    and the hosts' NICs only): their specs have none, and a simulated host tier on them is refused.
HOST_LINK_LATENCY_S = 10e-6
PCIE5_X16_BYTES_S = 64e9
KERNEL_LAUNCH_S = 2.5e-6
GRID_STEP_S = 0.35e-6
ROUND_OVERHEAD_GRAPH_S = 1.0e-3
ROUND_OVERHEAD_EAGER_S = 3.3e-3
OVERHEAD_SOURCE = "0.3 ms graph-captured step beyond the weight read (cloudai.pt, H100) + 0.66 ms host plan/build"


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """``round_overhead_s``: the fixed cost of one round (launch, sync, host planning), with
    ``overhead_source`` saying where it comes from; ``mfu`` / ``mbu``: achieved fractions of peak
    FLOP/s and HBM bandwidth; ``backend``: which lowering of the Pallas scans runs (``"gpu"``: a
    pre-pass over producers for paired rounds; ``"tpu"``: a second full scan), with
    ``kernel_launch_s``, ``grid_step_s`` and ``sm_count``; ``host_link_bandwidth`` (bytes/s per
    direction, None: not published) and ``host_link_latency_s`` (see the notes above
    ``ROUND_OVERHEAD_GRAPH_S``)."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory_bytes: float
    round_overhead_s: float = ROUND_OVERHEAD_GRAPH_S
    overhead_source: str = OVERHEAD_SOURCE
    mfu: float = 0.5
    mbu: float = 0.7
    backend: str = "gpu"
    sm_count: int = 132
    kernel_launch_s: float = KERNEL_LAUNCH_S
    grid_step_s: float = GRID_STEP_S
    host_link_bandwidth: float | None = None
    host_link_latency_s: float = HOST_LINK_LATENCY_S


DEVICE_SPECS: dict[str, DeviceSpec] = {
    "h200": DeviceSpec(
        name="h200", peak_flops=989e12, hbm_bandwidth=4.8e12, memory_bytes=141e9, host_link_bandwidth=PCIE5_X16_BYTES_S
    ),
    # two H200 with tensor parallelism, communication not modelled (for models that need 2 GPUs)
    "h200x2": DeviceSpec(
        name="h200x2", peak_flops=2 * 989e12, hbm_bandwidth=2 * 4.8e12, memory_bytes=2 * 141e9, sm_count=2 * 132,
        host_link_bandwidth=2 * PCIE5_X16_BYTES_S,  # a link per GPU, each holding half of every state
    ),
    "tpu-v5e": DeviceSpec(
        name="tpu-v5e", peak_flops=197e12, hbm_bandwidth=0.819e12, memory_bytes=16e9, backend="tpu", sm_count=1
    ),
    "tpu-v6e": DeviceSpec(
        name="tpu-v6e", peak_flops=918e12, hbm_bandwidth=1.64e12, memory_bytes=32e9, backend="tpu", sm_count=1
    ),
}


def get_model_spec(name: str) -> ModelSpec:
    if name not in MODEL_SPECS:
        raise ValueError(f"unknown model spec {name!r}; specs: {', '.join(MODEL_SPECS)}")
    return MODEL_SPECS[name]


def get_device_spec(name: str) -> DeviceSpec:
    if name not in DEVICE_SPECS:
        raise ValueError(f"unknown device {name!r}; devices: {', '.join(DEVICE_SPECS)}")
    return DEVICE_SPECS[name]
