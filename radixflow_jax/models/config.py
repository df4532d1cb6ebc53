"""Frozen model configuration shared by every supported architecture.

One :class:`ModelConfig` describes a decoder-only hybrid model as a list of per-layer mixer kinds
(``attention``, ``gdn``, ``mamba``, ``parallel`` = attention and Mamba2 side by side on the same
input (Falcon-H1), ``none``) and per-layer MLP kinds (``dense`` SwiGLU, ``relu2``, ``moe``, ``glu``
= Granite's fused ``input_linear``/``output_linear`` SwiGLU, ``glu_moe`` = Granite's routed experts
plus that shared GLU, ``none``), plus the sub-configs each kind needs and the scalar
:class:`Multipliers` (identity unless the family has muP/Granite scaling). Parsing from a HF
``config.json`` lives in :mod:`radixflow_jax.models.hf_config`; this module holds no parsing logic.

Invariants:
  * ``len(mixers) == len(mlps) == num_layers``.
  * ``attention`` is set iff some layer is ``attention`` or ``parallel``; ``mamba`` iff some layer is
    ``mamba`` or ``parallel``; ``gdn`` iff some layer is ``gdn``; ``moe`` iff some layer's MLP is
    ``moe`` or ``glu_moe``.
  * A ``parallel`` layer owns one KV entry *and* one recurrent state entry: it is counted in both
    :attr:`ModelConfig.attention_layers` and :attr:`ModelConfig.recurrent_layers`.
  * Head counts divide: ``attention.num_heads % attention.num_kv_heads == 0`` and
    ``gdn.num_v_heads % gdn.num_k_heads == 0``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Mixer = Literal["attention", "gdn", "mamba", "parallel", "none"]
MlpKind = Literal["dense", "relu2", "moe", "glu", "glu_moe", "none"]
MambaNorm = Literal["gate_first", "norm_first", "none"]
NormStyle = Literal["llama", "zero_centered", "float32_weight"]


class ConfigError(ValueError):
    """A model config value is missing, invalid or unsupported; the message names the field."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding over the first ``rotary_dim`` channels of each head (rotate-half layout)."""

    theta: float
    rotary_dim: int
    kind: Literal["default", "linear", "llama3"] = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Softmax attention. ``qk_norm``: per-head RMSNorm on q and k (``none``, ``rms``, ``rms_zc``
    for the zero-centred ``1 + w`` form). ``output_gate``: q_proj also yields a per-head gate that
    multiplies the output by ``sigmoid(gate)`` (interleaved per head: query channels, then gate).
    ``scale``: the softmax scale; ``None`` means ``head_dim ** -0.5`` (Granite sets it explicitly)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    qk_norm: Literal["none", "rms", "rms_zc"]
    output_gate: bool
    bias: bool
    rope: RopeConfig | None
    sliding_window: int | None = None
    scale: float | None = None

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5 if self.scale is None else self.scale


@dataclasses.dataclass(frozen=True)
class GdnConfig:
    """Gated DeltaNet mixer. ``packed``: Qwen3-Next's ``in_proj_qkvz``/``in_proj_ba`` grouped by key
    head; otherwise Qwen3.5's split ``in_proj_qkv``/``in_proj_z``/``in_proj_b``/``in_proj_a``."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    packed: bool
    chunk_size: int = 64
    # tensor parallelism (models/sharding.py): the q/k/v conv channels are laid out in this many
    # stripes, stripe r holding [q_r | k_r | v_r] of its key heads (1: HF order [q | k | v])
    qkv_stripes: int = 1

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclasses.dataclass(frozen=True)
class MambaConfig:
    """Mamba2 (SSD) mixer: ``in_proj -> [z | xBC | dt]``, depthwise conv (+bias) + SiLU over xBC,
    SSD scan with ``A = -exp(A_log)``, ``dt = clamp(softplus(dt + dt_bias), *dt_limit)``, ``+ D x``,
    output gate, ``out_proj``. ``gated_norm``: ``gate_first`` = ``w * groupnorm(y * silu(z))``
    (Bamba, Nemotron-H, Granite), ``norm_first`` = ``w * groupnorm(y) * silu(z)``, ``none`` =
    ``y * silu(z)`` without a norm weight (the last two: Falcon-H1). ``proj_bias`` is the
    ``in_proj`` bias, ``out_proj_bias`` the ``out_proj`` one."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    conv_bias: bool
    proj_bias: bool
    chunk_size: int
    dt_limit: tuple[float, float]
    norm_eps: float
    out_proj_bias: bool = False
    gated_norm: MambaNorm = "gate_first"
    # tensor parallelism (models/sharding.py): in_proj rows and xBC conv channels in ``proj_stripes``
    # stripes, stripe r = heads r*H/s.. with their groups (needs n_groups % s == 0); 1: HF order
    proj_stripes: int = 1

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner_dim + 2 * self.n_groups * self.state_size


ParamPath = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class CheckpointNames:
    """One family's renaming table between the model's fixed attribute names and its checkpoint's.

    The model (``models/hybrid.py``) always names its submodules the same way: ``model.embed_tokens``,
    ``model.norm``, ``model.layers.{i}.{input_layernorm, self_attn, linear_attn, mamba,
    post_attention_layernorm, mlp, block_sparse_moe}`` (a block-layout layer: ``norm``, ``mixer``)
    and ``lm_head``. ``top`` renames a ``model.<name>`` attribute, ``layer`` a ``model.layers.{i}.<name>``
    one (pairs ``(model name, checkpoint name)``; unnamed ones are kept); ``prefix`` replaces the
    leading ``model.`` of a checkpoint key (``backbone.``, ``model.language_model.``). Invariant:
    each table is one-to-one, so :meth:`stored` has an inverse on the model's paths."""

    top: tuple[tuple[str, str], ...] = ()
    layer: tuple[tuple[str, str], ...] = ()
    prefix: str = "model."

    def stored(self, path: ParamPath) -> ParamPath:
        """The checkpoint's path of model parameter ``path`` (root ``model`` kept: the orbax form)."""
        if len(path) < 2 or path[0] != "model":
            return path
        if path[1] == "layers" and len(path) >= 4:
            return (*path[:3], dict(self.layer).get(str(path[3]), path[3]), *path[4:])
        return (path[0], dict(self.top).get(str(path[1]), path[1]), *path[2:])

    def key(self, path: ParamPath) -> str:
        """The checkpoint key (safetensors, GGUF via its family table) of model parameter ``path``."""
        name = ".".join(str(p) for p in self.stored(path))
        return self.prefix + name[len("model.") :] if name.startswith("model.") else name


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """Softmax router over ``num_experts``, top-k (renormalised when ``norm_topk``), SwiGLU experts
    of width ``intermediate_size``; an optional shared expert scaled by ``sigmoid(shared_gate(x))``
    (``shared_intermediate_size > 0``; Qwen). Granite's ``glu_moe`` uses ``norm_topk`` (softmax
    over the top-k logits is the same distribution) and its ungated shared GLU has the model's
    ``intermediate_size``, so ``shared_intermediate_size`` is 0 there."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk: bool
    shared_intermediate_size: int


@dataclasses.dataclass(frozen=True)
class Multipliers:
    """Scalar multipliers of the muP-style families; every default is the identity.

    Granite-4.0-H: ``embedding``, ``residual`` (``x + residual * f(x)`` for both sub-blocks),
    ``logits_scaling`` (logits are *divided* by it); its attention scale is
    :attr:`AttentionConfig.scale`. Falcon-H1: ``embedding``, ``lm_head`` (logits multiplied),
    ``attention_in``/``attention_out`` around the attention branch, ``key`` on k before RoPE,
    ``ssm_in`` on the Mamba2 input, ``ssm_out`` on its output, ``ssm`` on the ``in_proj`` output
    segments ``(z, x, B, C, dt)``, ``mlp_gate`` on ``gate_proj``'s output before SiLU, ``mlp_down``
    on the MLP output."""

    embedding: float = 1.0
    residual: float = 1.0
    logits_scaling: float = 1.0
    lm_head: float = 1.0
    attention_in: float = 1.0
    attention_out: float = 1.0
    key: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    ssm: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    mlp_gate: float = 1.0
    mlp_down: float = 1.0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs; built once, hashable, safe as a jit static argument."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    mixers: tuple[Mixer, ...]
    mlps: tuple[MlpKind, ...]
    intermediate_size: int
    rms_norm_eps: float
    norm_style: NormStyle
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention: AttentionConfig | None
    gdn: GdnConfig | None
    moe: MoeConfig | None
    mamba: MambaConfig | None = None
    checkpoint_names: CheckpointNames = CheckpointNames()
    # one ``norm`` and one ``mixer`` (attention, Mamba2 or an MLP) per layer (Nemotron-H), instead of
    # two pre-norms, a token mixer and an MLP
    block_layout: bool = False
    multipliers: Multipliers = Multipliers()
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # multi-token-prediction layers loaded beside the trunk (``models/mtp.py``): 0 unless the model
    # was loaded with ``mtp=True`` from a checkpoint that has them (HF ``mtp.*``, GGUF ``nextn``)
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        if not (len(self.mixers) == len(self.mlps) == self.num_layers):
            raise ConfigError(
                f"num_hidden_layers={self.num_layers} but {len(self.mixers)} layer types and "
                f"{len(self.mlps)} MLP kinds"
            )
        if bool(self.attention_layers) != (self.attention is not None):
            raise ConfigError("attention layers need an attention config (num_attention_heads, ...)")
        if ("gdn" in self.mixers) != (self.gdn is not None):
            raise ConfigError("linear_attention layers need the linear_* config fields")
        if any(m in ("mamba", "parallel") for m in self.mixers) != (self.mamba is not None):
            raise ConfigError("Mamba2 layers need the mamba_* / ssm_* config fields")
        if any(k in ("moe", "glu_moe") for k in self.mlps) != (self.moe is not None):
            raise ConfigError("MoE layers need num_experts / num_experts_per_tok / moe_intermediate_size")
        att = self.attention
        if att is not None and att.num_heads % att.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads={att.num_heads} is not a multiple of num_key_value_heads={att.num_kv_heads}"
            )
        gdn = self.gdn
        if gdn is not None and gdn.num_v_heads % gdn.num_k_heads:
            raise ConfigError(
                f"linear_num_value_heads={gdn.num_v_heads} is not a multiple of "
                f"linear_num_key_heads={gdn.num_k_heads}"
            )

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Layers owning a KV entry (``attention`` and ``parallel``), in layer order."""
        return tuple(i for i, m in enumerate(self.mixers) if m in ("attention", "parallel"))

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """Layers owning a conv/SSM state entry (``gdn``, ``mamba``, ``parallel``), in layer order."""
        return tuple(i for i, m in enumerate(self.mixers) if m in ("gdn", "mamba", "parallel"))

    @property
    def is_hybrid(self) -> bool:
        """True when the model carries recurrent state (prefix hits need checkpoints)."""
        return bool(self.recurrent_layers)
