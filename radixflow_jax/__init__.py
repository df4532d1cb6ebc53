"""RadixFlow-JAX: a JAX serving engine for hybrid LLMs with state-ready prefix-cache scheduling.

``LLM``, ``SamplingParams`` and ``RequestOutput`` are imported lazily, so ``radixflow_jax.cache`` and
``radixflow_jax.scheduler`` stay importable without JAX.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LLM",
    "InvalidParameterError",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "UnsupportedParameterError",
]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from radixflow_jax.llm import LLM

        return LLM
    if name in ("InvalidParameterError", "RequestOutput", "SamplingParams", "UnsupportedParameterError"):
        from radixflow_jax.engine import params

        return getattr(params, name)
    if name == "StructuredOutputsParams":
        from radixflow_jax.engine.grammar import StructuredOutputsParams

        return StructuredOutputsParams
    raise AttributeError(f"module 'radixflow_jax' has no attribute {name!r}")
