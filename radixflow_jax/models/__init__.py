"""Flax NNX hybrid models, HF config parsing and weight loading. ``load`` is the entry point."""

from radixflow_jax.models.api import LoadedModel, load
from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.safetensors_io import WeightsError

__all__ = ["ConfigError", "LoadedModel", "WeightsError", "load"]
