"""The seed guarantee for every proposer: with a seed, the target's own seeded draw decides each output position, so
an answer equals plain seeded sampling whatever the proposer (n-gram, draft model, head chain or tree, ngram+head),
K, tree or chain, or the adaptive controllers chose (here forced to random choices), at the engine and through the
API. Without a seed (an API request that sends none) soft drafts keep the rejection sampler."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.engine.adaptive import AdaptiveController
from localspec.engine.adaptive_tree import TreeSizeController
from localspec.engine.loop import Engine
from localspec.proposers import NgramProposer
from localspec.proposers.draft_model import DraftModelProposer
from localspec.proposers.head import HeadProposer
from localspec.proposers.lookup_first import LookupFirstProposer

from .support import make_head
from .test_server import CHAT, LOCAL, make_app

SEEDED = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=24, seed=3)


@pytest.fixture()
def chaos(monkeypatch):
    """The adaptive controllers forced to random choices: any K from 0 to its maximum, any tree size, chain or
    plain step, as timings or earlier answers could make them choose. Returns the Random that decides."""
    dice = random.Random(11)

    def choose_k(self) -> int:
        return dice.randint(0, self.max_k)

    def choose(self):
        return dice.choice([("tree", dice.choice(self.sizes)), ("chain", dice.randint(1, 4)), ("plain", 0)])

    monkeypatch.setattr(AdaptiveController, "choose_k", choose_k)
    monkeypatch.setattr(TreeSizeController, "choose", choose)
    return dice


@pytest.fixture(scope="module")
def engine(tiny_models):
    target, _ = tiny_models
    return Engine(target, exact=True)


def _prompt(engine) -> list[int]:
    ids = torch.randint(0, engine.target.vocab_size, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    return ids * 2  # a repeat: the n-gram lookup drafts too


def proposers(tiny_models) -> dict:
    target, draft = tiny_models
    return {
        "draft": lambda: DraftModelProposer(draft),
        "head": lambda: HeadProposer(make_head(target, "eagle")),
        "ngram+head": lambda: LookupFirstProposer(NgramProposer(1, 3), HeadProposer(make_head(target, "eagle"))),
    }


def answer(engine, spec: SpecConfig, proposer=None, sampling: SamplingParams = SEEDED) -> list[int]:
    events = list(engine.generate(_prompt(engine), sampling, spec, proposer))
    assert events[-1].error is None, events[-1].error
    return [t.token_id for e in events for t in e.tokens]


@pytest.mark.parametrize("name", ["draft", "head", "ngram+head"])  # n-gram alone: test_seeded.py
def test_a_seeded_answer_is_plain_seeded_sampling_whatever_the_controller_chose(engine, tiny_models, chaos, name):
    plain = answer(engine, SpecConfig(proposer="none"))
    make = proposers(tiny_models)[name]
    specs = [SpecConfig(proposer=name, k=k) for k in (1, 4)]
    specs += [SpecConfig(proposer=name, k=4, adaptive=True)]  # random K each step
    if name != "draft":  # a head drafts trees; ngram+head a tree or a chain per part
        specs += [SpecConfig(proposer=name, k=4, tree_nodes=6, adaptive=adaptive) for adaptive in (False, True)]
    for spec in specs:
        assert answer(engine, spec, make()) == plain, spec


def test_soft_drafts_are_kept_where_they_equal_the_targets_draw(engine, tiny_models):
    """The draft model's drafts are sampled with the noise the target draws the same position with: a draft close to
    the target is accepted often, and the events report its own p_draft."""
    _, draft = tiny_models
    spec = SpecConfig(proposer="draft", k=3)
    events = list(engine.generate(_prompt(engine), SEEDED, spec, DraftModelProposer(draft)))
    accepted = [t for e in events for t in e.tokens if t.kind == "accepted"]
    assert accepted and all(t.draft_prob is not None and 0.0 < t.draft_prob <= 1.0 for t in accepted)
    assert any(t.draft_prob < 1.0 for t in accepted)  # a soft draft's own probability, not one-hot


def test_without_a_seed_the_answer_still_follows_the_drafts_rejection_sampler(engine, tiny_models):
    """seeded False (an API request without a seed): the rejection sampler decides, and the answer depends on the
    drafts, as the full p/q test's does (the draft model's answer differs from plain sampling's with the same draws)."""
    _, draft = tiny_models
    unseeded = replace(SEEDED, seeded=False)
    plain = answer(engine, SpecConfig(proposer="none"), sampling=unseeded)
    assert plain == answer(engine, SpecConfig(proposer="none"))  # plain decoding draws each position alike
    drafted = answer(engine, SpecConfig(proposer="draft", k=3), DraftModelProposer(draft), unseeded)
    assert drafted != plain


# ---- through the API ----------------------------------------------------------------------------------------------
@pytest.fixture()
def api(tiny_session):
    from fastapi.testclient import TestClient

    with TestClient(make_app(tiny_session), base_url=LOCAL) as client:
        yield client


def text(client, **extra) -> str:
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 24, "temperature": 0.8, "seed": 3, **extra}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_the_same_seeded_request_gives_the_same_text_as_plain_sampling(api, chaos):
    plain = text(api, localspec={"proposer": "none"})
    assert text(api) == text(api) == plain  # the default entry: draft-model chains, the controller's random K
    for extension in ({"proposer": "draft", "k": 1}, {"proposer": "draft", "k": 5, "adaptive": True}):
        assert text(api, localspec=extension) == plain, extension
    assert text(api, seed=4) != plain  # the seed does reach the draws


def test_a_request_without_a_seed_is_not_seeded():
    from localspec.server.schemas import _sampling

    assert _sampling({"temperature": 0.8, "seed": 3}, 0, "top_logprobs").seeded
    unseeded = _sampling({"temperature": 0.8}, 0, "top_logprobs")
    assert not unseeded.seeded and 0 <= unseeded.seed < 2**63  # its draws still keyed to a drawn seed
