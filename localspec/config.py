"""Frozen configuration records shared by the engine, the CLI and the UI, and the one reader of the environment
(Environment: every LOCALSPEC_* variable, parsed by one rule)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

# gguf: a GGUF source's Q4_1 blocks as int4 linears (models/gguf_linear.py); auto: gguf or unquantized, timed
Quant = Literal["nf4", "int8", "gguf", "auto", "none"]
Dtype = Literal["float32", "bfloat16", "float16", "auto"]
# ngram+head: the n-gram lookup when it matches, the trained head otherwise (proposers/lookup_first.py);
# history: a lookup over the saved conversations and the current one (proposers/history.py); history+head: that
# lookup when it matches, the head otherwise
ProposerName = Literal["none", "ngram", "draft", "head", "ngram+head", "history", "history+head"]
SamplerName = Literal["auto", "torch", "triton"]

QUANTS: tuple[Quant, ...] = get_args(Quant)
DTYPES: tuple[Dtype, ...] = get_args(Dtype)
PROPOSERS: tuple[ProposerName, ...] = get_args(ProposerName)
SAMPLERS: tuple[SamplerName, ...] = get_args(SamplerName)

K_MIN, K_MAX = 1, 16  # draft tokens per step
DEFAULT_K = 4  # K where an entry, a request or a command does not say
NGRAM_MIN_N, NGRAM_MAX_N = 1, 4  # default n-gram sizes the lookup matches (shortest, longest)
NGRAM_N_MAX = 16  # the longest n-gram an entry may ask for
K_NAME = "K (draft tokens per step)"
TREE_NODES_MAX = 32  # draft nodes of a token tree per step (0 = a chain of K)
TREE_NODES_NAME = "tree nodes (draft tokens per tree step)"
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit value
TEMPERATURE_MAX = 5.0
TOP_LOGPROBS_MAX = 20  # OpenAI's limit on top_logprobs
PENALTY_MAX = 2.0  # OpenAI's bound on frequency_penalty and presence_penalty (either sign)
FIELD_LABELS = {
    "top_k": "top-k",
    "top_p": "top-p",
    "k": "K",
    "max_new_tokens": "max new tokens",
    "top_logprobs": "top logprobs",
    "repetition_penalty": "repetition penalty",
    "frequency_penalty": "frequency penalty",
    "presence_penalty": "presence penalty",
}


class ConfigError(ValueError):
    """A user-facing configuration or input problem, with a message meant to be shown as is."""


SHOWN_CHARS = 60  # how much of a bad value an error message quotes


def shown(value: Any) -> str:
    """A bad value as an error message quotes it: a short repr of a scalar, the size of anything else (a container
    is never formatted whole, so a huge or alias-expanded one costs nothing to report)."""
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value) if not isinstance(value, int) or abs(value) < 10**SHOWN_CHARS else "a very large number"
    elif isinstance(value, str):
        text = repr(value[:SHOWN_CHARS]) + ("…" if len(value) > SHOWN_CHARS else "")
    elif isinstance(value, (list, tuple, dict, set)):
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    else:
        return f"a {type(value).__name__}"
    return text


def whole_number(value: Any, what: str, low: int | None = None, high: int | None = None, hint: str = "") -> int:
    """value when it is an int (a bool is refused) within [low, high] where given; else a ConfigError naming `what`
    ("… must be a whole number between low and high (got …)", then `hint`)."""
    if not isinstance(value, bool) and isinstance(value, int):
        if (low is None or value >= low) and (high is None or value <= high):
            return value
    bounds = f" between {low} and {high}" if low is not None and high is not None else ""
    bounds = bounds or (f" ≥ {low}" if low is not None else "")
    raise ConfigError(f"{what} must be a whole number{bounds} (got {shown(value)}){hint}")


def check_ngram_sizes(min_n: int, max_n: int, what: str = "n-gram sizes") -> None:
    """The one rule for n-gram sizes: 1 ≤ min_n ≤ max_n."""
    if not 1 <= min_n <= max_n:
        raise ConfigError(f"{what} need 1 ≤ min_n ≤ max_n (got {min_n}, {max_n})")


def k_error(got: Any, what: str = K_NAME) -> ConfigError:
    """The message for a K (or list of K values) outside K_MIN..K_MAX."""
    return ConfigError(f"{what} must be between {K_MIN} and {K_MAX} (got {got!r})")


def check_k(value: int, what: str = K_NAME) -> int:
    if not K_MIN <= value <= K_MAX:
        raise k_error(value, what)
    return value


def check_tree_nodes(value: Any, what: str = TREE_NODES_NAME) -> int:
    return whole_number(value, what, 0, TREE_NODES_MAX, hint="; 0 drafts chains")


def check_seed(value: int) -> int:
    if not 0 <= value <= SEED_MAX:
        raise ConfigError(f"seed must be between 0 and 2**63 - 1 (got {value!r})")
    return value


def check_max_new_tokens(value: Any) -> int:
    return whole_number(value, "max new tokens", 1)


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    max_new_tokens: int = 256
    seed: int = 0
    # the seed was asked for: the answer must be plain seeded sampling's, whatever the engine drafts (the target's
    # own seeded draw decides every position). False (an API request without a seed, which gets a drawn one): drafts
    # with their own distribution may go through the full rejection sampler, which keeps more of them
    seeded: bool = True
    # per emitted token, the n most likely tokens and their log-probabilities under the distribution the sampler
    # used (logits_to_probs); 0 computes and transfers nothing more
    top_logprobs: int = 0
    # penalties on the target's distribution (runtime/penalties.py), at their neutral values here: vLLM's
    # repetition_penalty (> 1 lowers every token of the prompt and the answer so far), OpenAI's frequency_penalty
    # (minus it times a token's count in the answer) and presence_penalty (minus it once a token is in the answer)
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Some penalty changes the target's distribution (neutral ones change nothing and cost nothing)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def validate(self) -> SamplingParams:
        for name in ("temperature", "top_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            too_big = isinstance(value, int) and abs(value) > 10**300
            if isinstance(value, bool) or not isinstance(value, (int, float)) or too_big:
                raise ConfigError(f"{FIELD_LABELS.get(name, name)} must be a number in range (got {shown(value)})")
        check_max_new_tokens(self.max_new_tokens)
        for name in ("top_k", "seed", "top_logprobs"):
            whole_number(getattr(self, name), FIELD_LABELS.get(name, name))
        check_seed(self.seed)
        if not isinstance(self.seeded, bool):
            raise ConfigError(f"seeded must be true or false (got {self.seeded!r})")
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= TEMPERATURE_MAX:
            raise ConfigError(
                f"temperature must be between 0 and {TEMPERATURE_MAX:g} (got {self.temperature!r}); 0 means greedy"
            )
        if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top-p must be in (0, 1] (got {self.top_p!r}); 1 turns it off")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top-k must be a whole number ≥ 0 (got {self.top_k!r}); 0 turns it off")
        if not 0 <= self.top_logprobs <= TOP_LOGPROBS_MAX:
            raise ConfigError(
                f"top logprobs must be between 0 and {TOP_LOGPROBS_MAX} (got {self.top_logprobs!r}); 0 turns it off"
            )
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0.0:
            raise ConfigError(
                f"repetition penalty must be a number > 0 (got {self.repetition_penalty!r}); 1 turns it off, "
                "above 1 discourages repeating the prompt's and the answer's tokens"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not math.isfinite(value) or not -PENALTY_MAX <= value <= PENALTY_MAX:
                raise ConfigError(
                    f"{FIELD_LABELS[name]} must be between -{PENALTY_MAX:g} and {PENALTY_MAX:g} (got {value!r}); "
                    "0 turns it off"
                )
        return self


@dataclass(frozen=True)
class SpecConfig:
    """How the engine speculates. proposer 'none' is plain decoding through the same loop."""

    proposer: ProposerName = "ngram"
    k: int = DEFAULT_K
    sampler: SamplerName = "auto"
    ngram_min: int = NGRAM_MIN_N
    ngram_max: int = NGRAM_MAX_N
    adaptive: bool = False  # pick K ≤ k each step from measured costs and acceptance; 0 = plain step
    # > 0: a proposer that drafts trees (the head) drafts a tree of this many nodes per step, verified in one forward
    # (engine/policy.py); proposers without trees, and targets without the preallocated cache, draft chains of k.
    # With adaptive, each step is a tree of ≤ tree_nodes nodes, a chain of ≤ k, or plain (engine/adaptive_tree.py)
    tree_nodes: int = 0

    def validate(self) -> SpecConfig:
        for name in ("k", "ngram_min", "ngram_max"):
            whole_number(getattr(self, name), FIELD_LABELS.get(name, name.replace("_", " ")))
        if self.proposer not in PROPOSERS:
            raise ConfigError(f"unknown proposer {self.proposer!r}; choose one of {', '.join(PROPOSERS)}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {self.sampler!r}; choose one of {', '.join(SAMPLERS)}")
        check_k(self.k)
        check_tree_nodes(self.tree_nodes)
        check_ngram_sizes(self.ngram_min, self.ngram_max)
        return self


def require_proposer(pair_name: str, name: str, available: tuple[str, ...], why: str = "") -> None:
    """The one message for a proposer a pair (or what of it loaded) does not have; `why` says why it is missing."""
    if name not in available:
        raise ConfigError(f"model pair {pair_name!r} has no {name!r} proposer{why}; it has: {', '.join(available)}")


@dataclass(frozen=True)
class ModelSpec:
    """Where one model's weights come from and how to load them.

    source is one of: 'gguf-package:<python package>/<file.gguf>', a local folder path, or a hub id.
    """

    source: str
    quant: Quant = "none"
    dtype: Dtype = "float32"  # or auto: bf16 on CUDA where supported, else fp16; float32 on CPU
    trust_remote_code: bool = False
    device_map: str | None = None  # accelerate's device_map ("auto", "balanced", ...): a model over several GPUs


@dataclass(frozen=True)
class NgramSpec:
    min_n: int = NGRAM_MIN_N
    max_n: int = NGRAM_MAX_N


@dataclass(frozen=True)
class PairSpec:
    """One entry of models.yaml: a target and the proposers it can run with."""

    name: str
    target: ModelSpec
    k: int = DEFAULT_K
    default_proposer: ProposerName = "ngram"
    adaptive: bool = False  # pick K ≤ k each step from measured costs and acceptance (and switch off when it loses)
    tree_nodes: int = 0  # > 0: a proposer that drafts trees drafts one of this many nodes per step (SpecConfig)
    exact: str = "auto"  # auto | on | off: the target's exact forward setup (models/exact_choice.py)
    ngram: NgramSpec | None = field(default_factory=NgramSpec)
    draft: ModelSpec | None = None
    head: str | None = None  # folder of a trained feature-level head (EAGLE / Eagle3 / MTP)
    description: str = ""

    def require_proposer(self, name: str) -> None:
        require_proposer(self.name, name, self.proposers)

    @property
    def proposers(self) -> tuple[ProposerName, ...]:
        names = ["none"]
        if self.ngram is not None:
            names.append("ngram")
        if self.draft is not None:
            names.append("draft")
        if self.head is not None:
            names.append("head")
        if self.head is not None and self.ngram is not None:
            names.append("ngram+head")
        if self.ngram is not None:  # the lookup over the user's history takes the n-gram settings
            names.append("history")
        if self.head is not None and self.ngram is not None:
            names.append("history+head")
        return tuple(names)


# ---- the environment -------------------------------------------------------------------------------------------------
ForwardKind = Literal["lean", "transformers"]  # lean: runtime/lean_llama.py where it applies; transformers' own
CompileMode = Literal["off", "default", "reduce-overhead"]  # runtime/compiled.py
FORWARD_KINDS: tuple[ForwardKind, ...] = get_args(ForwardKind)
COMPILE_MODES: tuple[CompileMode, ...] = get_args(CompileMode)
SWITCH_ON, SWITCH_OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
# every variable the app reads, and what it does (`localspec --help` and docs/ name them from here)
ENVIRONMENT = {
    "LOCALSPEC_HOME": "the data folder (conversations, caches, built kernels); default: the user data folder",
    "LOCALSPEC_ALLOW_DOWNLOAD": "switch, off: let transformers fetch a model from the hub (else HF_HUB_OFFLINE=1)",
    "LOCALSPEC_API_KEY": "the key API clients send as 'Authorization: Bearer <key>' (needed on a non-loopback host)",
    "LOCALSPEC_PASSWORD": "the chat window's password on a non-loopback host",
    "LOCALSPEC_ALLOWED_HOSTS": "list: more Host names the server answers (server/guard.py)",
    "LOCALSPEC_CORS_ORIGINS": "list: more origins a browser may call the API from (server/guard.py)",
    "LOCALSPEC_BENCH_DATA": "the folder of the benchmark prompts (bench/prompts.py)",
    "LOCALSPEC_Q4_KERNEL": "switch, on: the kernels' library (runtime/library.py); off keeps torch's kernels",
    "LOCALSPEC_LAYER_KERNEL": "switch, on: the whole-layer kernel (runtime/layer_kernel.py); off keeps torch ops",
    "LOCALSPEC_THREADS_FOLLOW_LOAD": "switch, on: fewer threads while other processes keep cores busy, where every "
    "forward runs on the kernels (engine/threads.py)",
    "LOCALSPEC_AMX": "switch, on: the q4 matmuls' AMX tiles for many-row calls where the CPU has AMX-INT8",
    "LOCALSPEC_PACKED": "switch, on: oneDNN-prepacked bf16 linears (runtime/packed_linear.py)",
    "LOCALSPEC_FORWARD": "lean (default) | transformers: the backbone forward (runtime/lean_llama.py)",
    "LOCALSPEC_COMPILE": "off (default) | default | reduce-overhead: torch.compile of verify forwards",
    "LOCALSPEC_WRITE_SCREENSHOT": "switch, off: tests/test_browser.py rewrites the README's screenshot",
}


def env_switch(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """The one rule for an on/off variable: unset or blank → default; 1/on/true/yes or 0/off/false/no (any case);
    anything else is a ConfigError naming the variable."""
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in SWITCH_ON or raw in SWITCH_OFF:
        return raw in SWITCH_ON
    raise ConfigError(f"{name}={shown(raw)} is not a switch; use on or off (also 1/0, true/false, yes/no)")


def env_list(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    """The one rule for a list variable: comma-separated, blanks dropped."""
    return tuple(part.strip() for part in environ.get(name, "").split(",") if part.strip())


def env_choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = environ.get(name, "").strip() or default
    if raw not in choices:
        raise ConfigError(f"{name}={shown(raw)} is not one of {', '.join(choices)}")
    return raw


@dataclass(frozen=True)
class Environment:
    """Every LOCALSPEC_* variable (ENVIRONMENT says what each does), read here only: `Environment.read()` takes them
    from os.environ (or a mapping a test gives) at once, and each typed field parses its own variable by the one rule
    of its kind when asked for, so a malformed switch is a ConfigError where it is used and never stops the rest
    (the data folder, the server's keys). Modules take their values from here, never from os.environ."""

    raw: tuple[tuple[str, str], ...] = ()  # the LOCALSPEC_* variables as set, sorted

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        env = os.environ if environ is None else environ
        return cls(tuple(sorted((k, v) for k, v in env.items() if k.startswith("LOCALSPEC_"))))

    def _text(self, name: str) -> str | None:
        return dict(self.raw).get(name) or None

    home = property(lambda self: self._text("LOCALSPEC_HOME"))
    api_key = property(lambda self: self._text("LOCALSPEC_API_KEY"))
    password = property(lambda self: self._text("LOCALSPEC_PASSWORD"))
    bench_data = property(lambda self: self._text("LOCALSPEC_BENCH_DATA"))

    @property
    def allow_download(self) -> bool:
        return env_switch(dict(self.raw), "LOCALSPEC_ALLOW_DOWNLOAD", False)

    @property
    def allowed_hosts(self) -> tuple[str, ...]:
        return env_list(dict(self.raw), "LOCALSPEC_ALLOWED_HOSTS")

    @property
    def cors_origins(self) -> tuple[str, ...]:
        return env_list(dict(self.raw), "LOCALSPEC_CORS_ORIGINS")

    @property
    def q4_kernel(self) -> bool:
        return env_switch(dict(self.raw), "LOCALSPEC_Q4_KERNEL", True)

    @property
    def layer_kernel(self) -> bool:
        return env_switch(dict(self.raw), "LOCALSPEC_LAYER_KERNEL", True)

    @property
    def threads_follow_load(self) -> bool:
        return env_switch(dict(self.raw), "LOCALSPEC_THREADS_FOLLOW_LOAD", True)

    @property
    def amx(self) -> bool:
        return env_switch(dict(self.raw), "LOCALSPEC_AMX", True)

    @property
    def packed(self) -> bool:
        return env_switch(dict(self.raw), "LOCALSPEC_PACKED", True)

    @property
    def forward(self) -> ForwardKind:
        return env_choice(dict(self.raw), "LOCALSPEC_FORWARD", FORWARD_KINDS, "lean")  # type: ignore[return-value]

    @property
    def compile(self) -> CompileMode:
        return env_choice(dict(self.raw), "LOCALSPEC_COMPILE", COMPILE_MODES, "off")  # type: ignore[return-value]

    @property
    def write_screenshot(self) -> bool:
        return env_switch(dict(self.raw), "LOCALSPEC_WRITE_SCREENSHOT", False)


def cache_dir():
    """The data folder's cache (LOCALSPEC_HOME/cache, else the user's cache folder): the kernels' library and the
    converted models live there."""
    from pathlib import Path

    home = Environment.read().home
    if home:
        return Path(home).expanduser() / "cache"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("localspec", appauthor=False))
