"""Field readers shared by every ``config.json`` family parser (``hf_config``, ``hf_config_ssm``,
``hf_config_mup``) and, through them, by GGUF metadata (``models/gguf/`` maps it to HF fields).

Each reader takes the raw config dict, reads one field (or one group of fields) explicitly, and
raises :class:`ConfigError` naming the field when it is missing, of the wrong type, out of range or
unsupported; defaults are the ones ``transformers`` applies when a key is absent. This module imports
no parser: the family modules import it, and ``hf_config`` imports the families (no cycle).
"""

from __future__ import annotations

import math
from typing import Any

from radixflow_jax.models.config import AttentionConfig, ConfigError, MambaConfig, RopeConfig


def required(cfg: dict[str, Any], key: str, kind: type | tuple[type, ...] = int) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config.json: required field '{key}' is missing")
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"config.json: field '{key}' must be {kind}, got {value!r}")
    return value


def positive(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    if default is not None and cfg.get(key) is None:
        return default
    value = required(cfg, key, int)
    if value <= 0:
        raise ConfigError(f"config.json: field '{key}' must be positive, got {value}")
    return value


def check_act(cfg: dict[str, Any], key: str = "hidden_act") -> None:
    act = cfg.get(key, "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"config.json: {key}={act!r} is not supported (only 'silu')")


def eos_ids(cfg: dict[str, Any]) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def read_rope(cfg: dict[str, Any], head_dim: int) -> RopeConfig:
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    kind = params.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
    src = params if "rope_type" in params else legacy
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError(f"config.json: rope_theta must be a positive number, got {theta!r}")
    if not 0 < float(factor) <= 1:
        raise ConfigError(f"config.json: partial_rotary_factor must be in (0, 1], got {factor!r}")
    rotary_dim = int(head_dim * float(factor))
    if rotary_dim % 2:
        raise ConfigError(f"config.json: rotary dim {rotary_dim} (head_dim * partial_rotary_factor) must be even")
    if kind == "default":
        return RopeConfig(theta=float(theta), rotary_dim=rotary_dim)
    if kind == "linear":
        return RopeConfig(theta=float(theta), rotary_dim=rotary_dim, kind="linear", factor=float(src["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=float(theta),
            rotary_dim=rotary_dim,
            kind="llama3",
            factor=float(src["factor"]),
            low_freq_factor=float(src["low_freq_factor"]),
            high_freq_factor=float(src["high_freq_factor"]),
            original_max_position=int(src["original_max_position_embeddings"]),
        )
    raise ConfigError(f"config.json: rope_type={kind!r} is not supported (default, linear, llama3)")


def float_value(value: Any, field: str) -> float:
    """JSON floats, including transformers' ``{"__float__": "Infinity"}`` encoding."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config.json: {field} has a non-numeric entry {value!r}") from exc


def dt_limit(raw: Any, field: str) -> tuple[float, float]:
    if not isinstance(raw, (list, tuple)) or len(raw) != 2:
        raise ConfigError(f"config.json: {field} must be a pair [min, max], got {raw!r}")
    lo, hi = float_value(raw[0], field), float_value(raw[1], field)
    if not 0 <= lo < hi:
        raise ConfigError(f"config.json: {field}={raw!r} must satisfy 0 <= min < max")
    return lo, hi


def read_mamba(cfg: dict[str, Any], keys: dict[str, str], limit: tuple[float, float], eps: float) -> MambaConfig:
    """The Mamba2 mixer fields, named per family by ``keys`` (heads, head_dim, state, groups, conv, ...)."""
    act = cfg.get(keys.get("act", ""), "silu") if "act" in keys else "silu"
    if act not in ("silu", "swish"):
        raise ConfigError(f"config.json: {keys['act']}={act!r} is not supported (only 'silu')")
    m = MambaConfig(
        num_heads=positive(cfg, keys["heads"]),
        head_dim=positive(cfg, keys["head_dim"]),
        state_size=positive(cfg, keys["state"]),
        n_groups=positive(cfg, keys["groups"]),
        conv_kernel=positive(cfg, keys["conv"], 4),
        conv_bias=bool(cfg.get(keys["conv_bias"], True)),
        proj_bias=bool(cfg.get(keys["proj_bias"], False)),
        chunk_size=positive(cfg, keys["chunk"], 256),
        dt_limit=limit,
        norm_eps=eps,
        out_proj_bias=bool(cfg.get(keys["proj_bias"], False)),
    )
    if m.num_heads % m.n_groups:
        raise ConfigError(f"config.json: {keys['heads']}={m.num_heads} is not a multiple of {keys['groups']}={m.n_groups}")
    return m


def number(cfg: dict[str, Any], key: str, default: float = 1.0, *, nonzero: bool = False) -> float:
    """A finite scalar multiplier (``default`` when the key is absent)."""
    if key not in cfg:
        return default
    value = cfg[key]
    if value is None or isinstance(value, bool):
        raise ConfigError(f"config.json: field '{key}' must be a number, got {value!r}")
    out = float_value(value, key)
    if not math.isfinite(out) or (nonzero and out == 0.0):
        what = "finite non-zero" if nonzero else "finite"
        raise ConfigError(f"config.json: field '{key}' must be a {what} number, got {value!r}")
    return out


def numbers(cfg: dict[str, Any], key: str, count: int) -> tuple[float, ...]:
    raw = cfg.get(key)
    if raw is None:
        return (1.0,) * count
    if not isinstance(raw, (list, tuple)) or len(raw) != count:
        raise ConfigError(f"config.json: field '{key}' must be a list of {count} numbers, got {raw!r}")
    return tuple(number({key: v}, key) for v in raw)


def read_attention(cfg: dict[str, Any], qk_norm: str, output_gate: bool) -> AttentionConfig:
    heads = positive(cfg, "num_attention_heads")
    head_dim = cfg.get("head_dim") or positive(cfg, "hidden_size") // heads
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    if window is not None:
        raise ConfigError("config.json: use_sliding_window=true is not supported yet")
    return AttentionConfig(
        num_heads=heads,
        num_kv_heads=positive(cfg, "num_key_value_heads", heads),
        head_dim=int(head_dim),
        qk_norm=qk_norm,  # type: ignore[arg-type]
        output_gate=output_gate,
        bias=bool(cfg.get("attention_bias", False)),
        rope=read_rope(cfg, int(head_dim)),
    )
