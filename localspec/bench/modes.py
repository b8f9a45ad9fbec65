"""One small runner per benchmark mode. Every mode answers the same prompt ids with the same loaded weights,
greedy, up to max_new_tokens new tokens, stopping after a stop token (which counts, as in generate())."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from localspec.config import K_MAX, K_MIN, ConfigError, SamplingParams, SpecConfig, check_tree_nodes, k_error
from localspec.engine.events import steps
from localspec.engine.metrics import StatsSnapshot
from localspec.structured.grammar import Constraint

from .llama_cpp import LLAMA_MODES

HF_MODES = ("hf", "hf-fp32", "hf-pld", "hf-assisted")
TREE_MODES = {  # mode → its proposer
    "ngram-tree": "ngram",
    "head-tree": "head",
    "ngram+head-tree": "ngram+head",
    "history-tree": "history",
}
# history: the bench answers with an empty history (its index fills in the app, from saved conversations), so it
# measures the lookup over the current prompt; docs/usage.md records it measured with a history
ENGINE_MODES = ("none", "ngram", "draft", "head", "ngram+head", "history", *TREE_MODES, "adaptive", "adaptive-tree")
ALL_MODES = HF_MODES + ENGINE_MODES + LLAMA_MODES
SWEPT = ("ngram", "draft", "head", "ngram+head", "history")  # run once per K of --k
DEFAULT_ADAPTIVE_MAX_K = 8
DEFAULT_TREE_NODES = 8  # tree modes: draft nodes of the token tree per step (adaptive-tree: the most it may pick)


@dataclass(frozen=True)
class Mode:
    """name: one of ALL_MODES; k: draft tokens per step (the ceiling for adaptive); proposer: the tree modes' and
    adaptive's; tree_nodes: a tree mode's nodes per step (adaptive-tree: the ceiling)."""

    name: str
    k: int | None = None
    proposer: str | None = None
    tree_nodes: int | None = None

    @property
    def label(self) -> str:
        if self.name in TREE_MODES:
            return f"{self.name} N={self.tree_nodes}"
        if self.name == "adaptive":
            return f"adaptive ({self.proposer}, K≤{self.k})"
        if self.name == "adaptive-tree":
            return f"adaptive tree ({self.proposer}, K≤{self.k}, N≤{self.tree_nodes})"
        return self.name if self.k is None or self.name == "hf-assisted" else f"{self.name} K={self.k}"

    @property
    def is_adaptive(self) -> bool:
        return self.name in ("adaptive", "adaptive-tree")


@dataclass
class RunResult:
    """One prompt through one mode. The Hugging Face modes have no engine statistics (stats None)."""

    token_ids: list[int]
    seconds: float  # wall time of the whole answer, prefill included
    cpu_seconds: float  # CPU time this process used meanwhile: on a shared machine the steadier measure
    stats: StatsSnapshot | None = None  # the engine's, at the answer's last step
    k_per_step: list[int] = field(default_factory=list)  # adaptive: the K asked for at each step (0 = plain)
    # the llama.cpp modes: llama.cpp's own timings of the answer (llama_server.Completion.timings)
    peer_timings: dict | None = None
    schema_valid: bool | None = None  # a JSON-schema task's complete answer: valid against its schema (None: cut)


def available_modes(session) -> dict[str, str | None]:
    """mode → None when it can run on this pair, else why not."""
    pair = session.loaded.spec
    has_draft = pair.draft is not None and session.loaded.draft is not None
    why_draft = None if has_draft else f"pair {pair.name!r} has no standalone draft model"
    fp32 = session.loaded.dtype is not None and session.loaded.dtype.dtype == "float32"
    why: dict[str, str | None] = {
        "hf": None,
        "none": None,
        "hf-fp32": "the target runs in float32 already (see hf)"
        if fp32
        else None
        if session.loaded.quant in ("none", "gguf")
        else f"a {session.loaded.quant} target has no float32 copy to run",
        "hf-pld": None,
        "hf-assisted": why_draft,
        "ngram": None if pair.ngram is not None else f"pair {pair.name!r} has no n-gram proposer",
        "draft": why_draft,
        "head": None if pair.head is not None else f"pair {pair.name!r} has no trained head",
        "ngram+head": (
            None if "ngram+head" in pair.proposers else f"pair {pair.name!r} lacks an n-gram proposer or a head"
        ),
        "history": None if "history" in pair.proposers else f"pair {pair.name!r} has no n-gram lookup to extend",
    }
    from .llama_cpp import why_not

    why.update(why_not(pair))
    why["adaptive"] = None if len(pair.proposers) > 1 else f"pair {pair.name!r} has no proposer to adapt"
    no_trees = None if session.engine.target.supports_tree else "the target's KV cache verifies chains only"
    for name, proposer in TREE_MODES.items():
        why[name] = why[proposer] or no_trees
    why["adaptive-tree"] = why["adaptive"] or no_trees
    return why


def parse_modes(
    names: list[str],
    ks: list[int],
    session,
    adaptive_max_k: int = DEFAULT_ADAPTIVE_MAX_K,
    hf_k: int | None = None,
    adaptive_proposers: list[str] | None = None,
    tree_nodes: int = DEFAULT_TREE_NODES,
) -> tuple[list[Mode], list[str]]:
    """Expand mode names over the K list (and adaptive over adaptive_proposers, default: the pair's default
    proposer); return (modes, notes about the modes that were skipped)."""
    pair = session.loaded.spec
    for proposer in adaptive_proposers or ():
        if proposer == "none" or proposer not in pair.proposers:
            raise ConfigError(
                f"--adaptive-proposers: pair {pair.name!r} has no {proposer!r} proposer to adapt; "
                f"it has: {', '.join(p for p in pair.proposers if p != 'none')}"
            )
    unknown = [n for n in names if n not in ALL_MODES]
    if unknown:
        raise ConfigError(f"unknown bench mode(s) {', '.join(unknown)}; choose from {', '.join(ALL_MODES)}")
    bad_k = [k for k in ks if not K_MIN <= k <= K_MAX]
    if bad_k:
        raise k_error(bad_k, "--k values")
    why_not = available_modes(session)

    def nodes(mode: str) -> int:
        if check_tree_nodes(tree_nodes, "--tree-nodes") == 0:
            raise ConfigError(f"--tree-nodes must be ≥ 1 for {mode} (0 would draft chains)")
        return tree_nodes

    modes, notes = [], []
    for name in dict.fromkeys(names):
        if why_not[name] is not None:
            notes.append(f"{name} skipped: {why_not[name]}")
            continue
        if name in SWEPT:
            modes.extend(Mode(name, k) for k in ks)
        elif name == "hf-pld":
            modes.append(Mode(name, hf_k or pair.k))
        elif name == "hf-assisted":
            modes.append(Mode(name, None))
        elif name in TREE_MODES:
            modes.append(Mode(name, proposer=TREE_MODES[name], tree_nodes=nodes(name)))
        elif name in ("adaptive", "adaptive-tree"):
            default = pair.default_proposer if pair.default_proposer != "none" else pair.proposers[1]
            modes.extend(
                Mode(name, max(adaptive_max_k, *ks), proposer, nodes(name) if name == "adaptive-tree" else None)
                for proposer in dict.fromkeys(adaptive_proposers or [default])
            )
        else:
            modes.append(Mode(name))
    if not modes:
        raise ConfigError("no bench mode can run on this model pair: " + "; ".join(notes))
    return modes, notes


def for_prompts(modes: list[Mode], prompts) -> tuple[list[Mode], list[str]]:
    """The modes that can answer these prompts, and a note per mode left out: a JSON-schema task is answered under
    its grammar, which only our engine applies (Hugging Face's generate() and llama.cpp's modes here do not)."""
    if not any(p.schema is not None for p in prompts):
        return modes, []
    kept = [m for m in modes if m.name in ENGINE_MODES]
    why = "the JSON-schema task is constrained decoding, ours only"
    notes = [f"{m.label} skipped: {why}" for m in modes if m not in kept]
    if not kept:
        raise ConfigError("the JSON-schema task runs on our engine's modes only (none, ngram, draft, head, ...)")
    return kept, notes


def run_mode(
    session, mode: Mode, prompt_ids: list[int], max_new_tokens: int, constraint: Constraint | None = None
) -> RunResult:
    if mode.name in ENGINE_MODES:
        return run_engine(session, mode, prompt_ids, max_new_tokens, constraint)
    if constraint is not None:
        raise ConfigError(f"{mode.label} cannot answer a JSON-schema task (for_prompts leaves it out)")
    if mode.name in HF_MODES:
        return run_hf(session, mode, prompt_ids, max_new_tokens)
    return run_llama_cpp(session, mode, prompt_ids, max_new_tokens)


_FLOAT32_COPIES: dict[int, torch.nn.Module] = {}  # id(loaded target) → the same weights loaded in float32


def float32_target(session) -> torch.nn.Module:
    """The target loaded again in float32: what a user gets from transformers out of the box (hf-fp32)."""
    from dataclasses import replace

    from localspec.models.loading import load_causal_lm

    loaded = session.loaded
    key = id(loaded.target)
    if key not in _FLOAT32_COPIES:
        spec = replace(loaded.spec.target, dtype="float32", quant="none")
        _FLOAT32_COPIES.clear()  # one copy at a time
        _FLOAT32_COPIES[key] = load_causal_lm(spec, "bench float32 baseline", loaded.device, "target")[0]
    return _FLOAT32_COPIES[key]


@torch.inference_mode()
def run_hf(session, mode: Mode, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
    """transformers generate(): plain greedy (in the target's dtype, or hf-fp32 in float32), prompt lookup (K), or
    assisted by the pair's draft model."""
    from transformers import GenerationConfig

    model = float32_target(session) if mode.name == "hf-fp32" else session.loaded.target
    stop_ids = sorted(session.engine.stop_token_ids)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stop_ids or None,
        pad_token_id=session.tokenizer.pad_token_id
        if session.tokenizer.pad_token_id is not None
        else (stop_ids[0] if stop_ids else 0),
    )
    kwargs = {}
    if mode.name == "hf-pld":
        config.prompt_lookup_num_tokens = mode.k
    elif mode.name == "hf-assisted":
        kwargs["assistant_model"] = session.loaded.draft
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=session.loaded.device)
    started, cpu_started = time.perf_counter(), time.process_time()
    output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, **kwargs)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return RunResult(output[0, len(prompt_ids) :].tolist(), seconds, cpu_seconds)


def run_llama_cpp(session, mode: Mode, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
    """llama.cpp's C++ on the target's own GGUF file, with torch's thread count (llama_cpp.py)."""
    from .llama_cpp import answer

    done = answer(session.loaded.spec, mode.name, torch.get_num_threads(), prompt_ids, max_new_tokens)
    return RunResult(done.token_ids, done.seconds, done.cpu_seconds, peer_timings=done.timings)


def engine_spec(session, mode: Mode) -> SpecConfig:
    """The engine settings of one of our modes. Only the tree modes and adaptive-tree draft trees: a chain mode
    runs chains whatever the entry's tree_nodes says."""
    if mode.is_adaptive:
        return session.default_spec(proposer=mode.proposer, k=mode.k, adaptive=True, tree_nodes=mode.tree_nodes or 0)
    if mode.name in TREE_MODES:
        return session.default_spec(proposer=mode.proposer, adaptive=False, tree_nodes=mode.tree_nodes)
    return session.default_spec(proposer=mode.name, k=mode.k or session.loaded.spec.k, adaptive=False, tree_nodes=0)


def run_engine(
    session, mode: Mode, prompt_ids: list[int], max_new_tokens: int, constraint: Constraint | None = None
) -> RunResult:
    """Our engine through the same loop for every proposer; none = plain decoding. With a constraint: its grammar
    masks the target and drafts its forced tokens first, as in an API answer (chat.answer_parts); none is then plain
    constrained decoding. The grammar's setup counts in the time, as it does for a user."""
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    spec = engine_spec(session, mode)
    token_ids: list[int] = []
    ks: list[int] = []
    last = None
    started, cpu_started = time.perf_counter(), time.process_time()
    proposer, processors = session.answer_parts(spec, constraint=constraint)
    for event in steps(session.engine.generate(prompt_ids, sampling, spec, proposer, processors=processors)):
        token_ids.extend(token.token_id for token in event.tokens)
        ks.append(event.stats.k)
        last = event
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    if last is not None and last.finish_reason == "error":
        raise RuntimeError(f"{mode.label}: {last.error}")
    return RunResult(token_ids, seconds, cpu_seconds, last.stats, ks if mode.is_adaptive else [])
