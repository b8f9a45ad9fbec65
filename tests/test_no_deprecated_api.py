"""Our hot path calls transformers the way the locked version wants: no DeprecationWarning / FutureWarning is raised
from a ModelRunner extend / crop, a draft proposer step, or a whole speculative answer on the tiny pair.

pyproject's filterwarnings ignores these categories for the suite, so the test turns them into errors itself."""

import warnings
from contextlib import contextmanager

import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.proposers.draft_model import DraftModelProposer
from localspec.runtime.model_runner import ModelRunner


@contextmanager
def deprecations_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        warnings.simplefilter("error", FutureWarning)
        yield


def test_model_runner_passes_the_cache_as_the_locked_transformers_names_it(tiny_models):
    target, _draft = tiny_models
    runner = ModelRunner(target)
    assert runner._cache_kwarg == "cache"  # transformers 5.24 deprecates past_key_values in favour of cache
    with deprecations_are_errors():
        runner.reset()
        first = runner.extend([1, 5, 9, 13], want_hidden=True, feature_layers=(0,))
        runner.crop(2)
        again = runner.extend([9, 13], logits_to_keep=1)
    assert torch.allclose(first.logits[-1], again.logits[-1], atol=1e-5)  # the crop really dropped positions 2, 3


def test_draft_proposer_step_raises_no_deprecation(tiny_models):
    _target, draft = tiny_models
    proposer = DraftModelProposer(draft)
    with deprecations_are_errors():
        proposer.begin([1, 5, 9], None)
        first = proposer.propose([1, 5, 9, 13], 3, SamplingParams(), torch.Generator().manual_seed(0))
        second = proposer.propose(
            [1, 5, 9, 13, first.token_ids[0], 7], 3, SamplingParams(), torch.Generator().manual_seed(0)
        )
    assert len(first.token_ids) == 3 and len(second.token_ids) == 3


def test_speculative_answers_raise_no_deprecation(tiny_session):
    ids, _notice = tiny_session.prompt_ids([{"role": "user", "content": "abc abc abc"}], 16)
    for proposer in ("draft", "ngram"):
        with deprecations_are_errors():
            events = list(
                tiny_session.stream_ids(ids, SamplingParams(max_new_tokens=16), SpecConfig(proposer=proposer, k=3))
            )
        assert events[-1].finished and events[-1].stats.emitted > 0
