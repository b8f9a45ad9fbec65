"""llama.cpp as a peer in `localspec bench`: the same GGUF file, the same chat-templated prompt ids, greedy, the same
max new tokens and thread count, timed like our modes (prefill included).

Modes: llama.cpp (plain decoding) and llama.cpp-lookup (llama-cpp-python's LlamaPromptLookupDecoding, LOOKUP_TOKENS
draft tokens). llama-cpp-python is an optional bench extra (`make setup-bench-llama`), imported only here and only
when such a mode runs.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from localspec.config import ConfigError

LLAMA_MODES = ("llama.cpp", "llama.cpp-lookup")
LOOKUP_TOKENS = 4  # num_pred_tokens of LlamaPromptLookupDecoding
CONTEXT_TOKENS = 4096  # n_ctx: the bench's prompts plus max new tokens fit
INSTALL_HINT = "llama-cpp-python is not installed; run: make setup-bench-llama"


class LlamaLike(Protocol):
    """What the adapter uses of llama_cpp.Llama (a stand-in in the tests)."""

    def reset(self) -> None: ...

    def generate(self, tokens: Sequence[int], **kwargs) -> Iterator[int]: ...


def why_not(source: str) -> str | None:
    """None when the llama.cpp modes can run for a target from `source`, else why not."""
    from localspec.config import ConfigError
    from localspec.models.loading import gguf_path
    from localspec.models.registry import GGUF_PREFIX

    if not source.startswith(GGUF_PREFIX):  # a packaged file is found when the mode runs
        try:
            if gguf_path(source) is None:
                return "the target is not a GGUF file"
        except ConfigError as exc:
            return str(exc)
    if importlib.util.find_spec("llama_cpp") is None:
        return INSTALL_HINT
    return None


def open_llama(path: Path, threads: int, lookup: bool) -> LlamaLike:
    """A llama_cpp.Llama on the file, with prompt-lookup speculation when `lookup`."""
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as exc:
        raise ConfigError(f"{INSTALL_HINT} ({exc})") from None
    draft = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS) if lookup else None
    # logits_all with a draft: llama-cpp-python turns it on for the context then but sizes its score buffer by the
    # argument (n_batch rows), so a prompt longer than one batch (512 tokens) fails ("could not broadcast ... into
    # shape (0,)") unless it is asked for here
    return Llama(
        model_path=str(path),
        n_ctx=CONTEXT_TOKENS,
        logits_all=lookup,
        n_threads=threads,
        n_threads_batch=threads,
        draft_model=draft,
        verbose=False,
    )


_OPEN: dict[tuple[str, int, bool], LlamaLike] = {}  # (file, threads, lookup) → the loaded model


def llama_for(path: Path, threads: int, lookup: bool) -> LlamaLike:
    key = (str(path), threads, lookup)
    if key not in _OPEN:
        _OPEN[key] = open_llama(path, threads, lookup)
    return _OPEN[key]


def greedy_ids(llm: LlamaLike, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int]) -> list[int]:
    """Greedy answer ids from a fresh state (no prefix reuse from an earlier run: its prefill is timed too), stopping
    after a stop token (which counts, as in generate()) or max_new_tokens."""
    llm.reset()
    out: list[int] = []
    tokens = llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    for token in tokens:
        out.append(int(token))
        if int(token) in stop_ids or len(out) >= max_new_tokens:
            break
    if isinstance(tokens, Generator):  # llama_cpp's: let it clean up now
        tokens.close()
    return out


def run_llama(llm: LlamaLike, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int]):
    """(token ids, seconds, cpu seconds) of one answer."""
    started, cpu_started = time.perf_counter(), time.process_time()
    ids = greedy_ids(llm, prompt_ids, max_new_tokens, stop_ids)
    return ids, time.perf_counter() - started, time.process_time() - cpu_started
