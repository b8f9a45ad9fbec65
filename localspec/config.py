"""Frozen configuration records shared by the engine, the CLI and the UI."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Quant = Literal["nf4", "int8", "none"]
ProposerName = Literal["none", "ngram", "draft", "head", "ngram+head"]
SamplerName = Literal["auto", "torch", "triton"]

QUANTS: tuple[str, ...] = ("nf4", "int8", "none")
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "auto")
# ngram+head: the n-gram lookup when it matches, the trained head otherwise (proposers/lookup_first.py)
PROPOSERS: tuple[str, ...] = ("none", "ngram", "draft", "head", "ngram+head")
SAMPLERS: tuple[str, ...] = ("auto", "torch", "triton")


class ConfigError(ValueError):
    """A user-facing configuration or input problem, with a message meant to be shown as is."""


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    max_new_tokens: int = 256
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> "SamplingParams":
        import math

        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int) and abs(value) > 10 ** 300):
                raise ConfigError(f"{name.replace('_', '-')} must be a number in range (got {value!r})")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise ConfigError(f"max new tokens must be a whole number ≥ 1 (got {self.max_new_tokens!r})")
        for name in ("top_k", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name.replace('_', ' ')} must be a whole number (got {value!r})")
        if not 0 <= self.seed < 2 ** 63:
            raise ConfigError(f"seed must be between 0 and 2**63 - 1 (got {self.seed!r})")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max new tokens must be a whole number ≥ 1 (got {self.max_new_tokens!r})")
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 5.0:
            raise ConfigError(f"temperature must be between 0 and 5 (got {self.temperature!r}); 0 means greedy")
        if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top-p must be in (0, 1] (got {self.top_p!r}); 1 turns it off")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top-k must be a whole number ≥ 0 (got {self.top_k!r}); 0 turns it off")
        return self


@dataclass(frozen=True)
class SpecConfig:
    """How the engine speculates. proposer 'none' is plain decoding through the same loop."""

    proposer: str = "ngram"
    k: int = 4
    sampler: str = "auto"
    ngram_min: int = 1
    ngram_max: int = 4
    adaptive: bool = False  # pick K ≤ k each step from measured costs and acceptance; 0 = plain step

    def validate(self) -> "SpecConfig":
        for name in ("k", "ngram_min", "ngram_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name.replace('_', ' ')} must be a whole number (got {value!r})")
        if self.proposer not in PROPOSERS:
            raise ConfigError(f"unknown proposer {self.proposer!r}; choose one of {', '.join(PROPOSERS)}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {self.sampler!r}; choose one of {', '.join(SAMPLERS)}")
        if not 1 <= self.k <= 16:
            raise ConfigError(f"K (draft tokens per step) must be between 1 and 16 (got {self.k!r})")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(f"n-gram sizes need 1 ≤ min_n ≤ max_n (got {self.ngram_min}, {self.ngram_max})")
        return self


@dataclass(frozen=True)
class ModelSpec:
    """Where one model's weights come from and how to load them.

    source is one of: 'gguf-package:<python package>/<file.gguf>', a local folder path, or a hub id.
    """

    source: str
    quant: str = "none"
    dtype: str = "float32"  # float32 | bfloat16 | float16 | auto (bf16 on CUDA where supported, else fp16; CPU fp32)
    trust_remote_code: bool = False
    device_map: str | None = None  # accelerate's device_map ("auto", "balanced", ...): a model over several GPUs


@dataclass(frozen=True)
class NgramSpec:
    min_n: int = 1
    max_n: int = 4


@dataclass(frozen=True)
class PairSpec:
    """One entry of models.yaml: a target and the proposers it can run with."""

    name: str
    target: ModelSpec
    k: int = 4
    default_proposer: str = "ngram"
    adaptive: bool = False  # pick K ≤ k each step from measured costs and acceptance (and switch off when it loses)
    ngram: NgramSpec | None = field(default_factory=NgramSpec)
    draft: ModelSpec | None = None
    head: str | None = None  # folder of a trained feature-level head (EAGLE / Eagle3 / MTP)
    description: str = ""

    @property
    def proposers(self) -> tuple[str, ...]:
        names = ["none"]
        if self.ngram is not None:
            names.append("ngram")
        if self.draft is not None:
            names.append("draft")
        if self.head is not None:
            names.append("head")
        if self.head is not None and self.ngram is not None:
            names.append("ngram+head")
        return tuple(names)
