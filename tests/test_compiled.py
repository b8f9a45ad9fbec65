"""The compiled verify path: row buckets (padding rows cropped after) give the eager tokens; K changes reuse graphs."""

import pytest
import torch

from localspec.config import ConfigError, Environment, SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.proposers import DraftModelProposer
from localspec.runtime import compiled
from localspec.runtime.model_runner import ModelRunner
from tests.support import COUNTING_PROMPT

PROMPT = COUNTING_PROMPT


def _answer(target, draft, runner, k, max_new=40):
    engine = Engine(target)
    engine.target = runner
    events = list(
        engine.generate(
            PROMPT, SamplingParams(max_new_tokens=max_new), SpecConfig(proposer="draft", k=k), DraftModelProposer(draft)
        )
    )
    assert events[-1].finish_reason == "length", events[-1].error
    return [t.token_id for e in events for t in e.tokens]


def test_buckets():
    assert [compiled.bucket(n) for n in (1, 2, 3, 5, 9, 16, 17)] == [1, 2, 4, 8, 16, 16, None]


def test_the_flag_is_checked():
    with pytest.raises(ConfigError, match="LOCALSPEC_COMPILE"):
        assert Environment.read({"LOCALSPEC_COMPILE": "fastest"}).compile
    assert Environment.read({"LOCALSPEC_COMPILE": "default"}).compile == "default"
    assert Environment.read({}).compile == "off"


def test_padded_buckets_keep_the_real_rows_and_the_cache(tiny_models):
    """The bucket path with the eager backbone standing in for the compiled one: padding rows change nothing."""
    target, _ = tiny_models
    padded, plain = ModelRunner(target, compile="off"), ModelRunner(target, compile="off")
    padded._compiled = padded._backbone  # take the bucket path without compiling
    for runner in (padded, plain):
        runner.reset()
        runner.extend(PROMPT)
    for rows in (1, 3, 5, 6, 2):
        new = list(range(50, 50 + rows))
        torch.testing.assert_close(padded.extend(new).logits, plain.extend(new).logits, rtol=1e-5, atol=1e-5)
        assert padded.cache.get_seq_length() == len(padded.tokens) == len(plain.tokens)
        padded.crop(len(PROMPT) + 1)
        plain.crop(len(PROMPT) + 1)


def test_bucketed_answers_equal_eager(tiny_models):
    target, draft = tiny_models
    eager = ModelRunner(target, compile="off")
    stand_in = ModelRunner(target, compile="off")
    stand_in._compiled = stand_in._backbone
    for k in (2, 3, 5):
        assert _answer(target, draft, stand_in, k) == _answer(target, draft, eager, k)


@pytest.mark.slow
def test_compiled_and_eager_give_the_same_tokens_and_k_changes_do_not_recompile(tiny_models):
    from torch._dynamo.utils import counters

    target, draft = tiny_models
    eager, fast = ModelRunner(target, compile="off"), ModelRunner(target, compile="default")
    for k in (3, 5):  # buckets 4 and 8, and 1, 2 on short steps
        assert _answer(target, draft, fast, k) == _answer(target, draft, eager, k)
    graphs = counters["stats"]["unique_graphs"]
    for k in (2, 6):  # rows 3 and 7: buckets already built
        assert _answer(target, draft, fast, k) == _answer(target, draft, eager, k)
    assert counters["stats"]["unique_graphs"] == graphs


def test_the_cuda_graph_layout_whole_capacity_static_cache_gives_the_eager_tokens(tiny_models):
    """reduce-overhead's cache (transformers' StaticCache, fixed shapes) with bucket padding, the eager backbone
    standing in for the CUDA-graph one (this check runs on any machine)."""
    from transformers import StaticCache

    target, draft = tiny_models
    eager = ModelRunner(target, compile="off")
    graphs = ModelRunner(target, compile="off", forward="transformers")  # what a reduce-overhead runner runs
    graphs.compile_mode, graphs._compiled = "reduce-overhead", graphs._backbone
    for k in (3, 5):
        assert _answer(target, draft, graphs, k) == _answer(target, draft, eager, k)
    assert isinstance(graphs.cache, StaticCache)
