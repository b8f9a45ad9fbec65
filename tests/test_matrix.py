"""The configuration matrix (issue 16): tiny random pairs shaped like the real families, at their real vocabulary
sizes, run through every target dtype x quantization x proposer x vocabulary shape a user can pick on a CPU.

Families (2 layers, hidden 64, made on the spot): "equal" is SmolLM2-shaped (Llama, 49,152 rows, tied embeddings,
target and draft the same size); "padded" is the Qwen2.5 pair (Qwen2, a 152,064-row untied 7B-like target and a
151,936-row tied 0.5B-like draft). The head is a random EAGLE head built on each target.

Every cell loads (or is refused with a message naming the entry and the field), answers greedy and sampled, keeps
greedy output identical to plain decoding under `guarantee_for` (a flip only where the target's top-2 gap is below
the path's flip_bound), and passes the chi-square check at temperature 1 (K = 2) on the cell's own target logits
and draft probabilities at one context, restricted to a support of ~300 tokens (the target's and draft's top tokens
and, padded, 16 ids the draft lacks) so 20,000 samples stay cheap.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from localspec.chat import ChatSession
from localspec.config import ConfigError, ModelSpec, NgramSpec, PairSpec, SamplingParams, SpecConfig
from localspec.heads.io import save_head
from localspec.models.loading import load_pair
from localspec.proposers.base import DraftNoise
from localspec.runtime.model_runner import ModelRunner
from localspec.testing import FAMILY_VOCABS, make_family_model, make_tiny_tokenizer
from localspec.verify import get_verifier
from localspec.verify.checks import chi_square_p, emitted_distribution_pvalues
from localspec.verify.guarantee import guarantee_for
from tests.support import make_head

PROMPT = [1, 72, 101, 108, 108, 111, 32, 72, 101, 108]  # "Hello He…": the n-gram lookup has a match to draft from
FAMILIES = {
    "equal": ("llama", FAMILY_VOCABS["smollm2"], FAMILY_VOCABS["smollm2"], True),
    "padded": ("qwen2", FAMILY_VOCABS["qwen2.5-7b"], FAMILY_VOCABS["qwen2.5-0.5b"], False),
}
DTYPES = ("float32", "bfloat16", "float16")
QUANTS = ("none", "nf4", "int8")
PROPOSERS = ("none", "ngram", "draft", "head", "ngram+head")
# the fast suite keeps one full row (every proposer on the padded pair in bf16) and one cell of each other path
FAST = {("padded", "bfloat16", "none")}
FAST_SINGLES = {
    ("padded", "float32", "nf4", "draft"),
    ("equal", "float32", "int8", "ngram+head"),
    ("equal", "float16", "none", "head"),
    ("equal", "float32", "none", "draft"),
    ("padded", "float32", "none", "ngram+head"),
}
K = 2
P_MIN = 1e-4  # every p-value of the check; fixed seeds, so a cell passes or fails the same way each run


def _cells():
    for vocab in FAMILIES:
        for dtype in DTYPES:
            for quant in QUANTS:
                for proposer in PROPOSERS:
                    fast = (vocab, dtype, quant) in FAST or (vocab, dtype, quant, proposer) in FAST_SINGLES
                    yield pytest.param(
                        vocab,
                        dtype,
                        quant,
                        proposer,
                        marks=() if fast else pytest.mark.slow,
                        id=f"{vocab}-{dtype}-{quant}-{proposer}",
                    )


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("families")
    folders = {}
    for name, (family, target_vocab, draft_vocab, tied) in FAMILIES.items():
        target, draft, head = root / f"{name}-target", root / f"{name}-draft", root / f"{name}-head"
        make_family_model(target, family, target_vocab, seed=0, tied=tied)
        make_family_model(draft, family, draft_vocab, seed=1, tied=True, base=target, noise=0.2)
        for folder in (target, draft):
            make_tiny_tokenizer(folder)
        save_head(make_head(AutoModelForCausalLM.from_pretrained(target).eval(), "eagle"), head)
        folders[name] = (target, draft, head)
    return folders


_LOADED: dict = {}  # one loaded pair at a time: the grid runs its cells grouped by (vocab, dtype, quant)


def _session(folders, vocab, dtype, quant):
    key = (vocab, dtype, quant)
    if key not in _LOADED:
        _LOADED.clear()
        target, draft, head = folders[vocab]
        pair = PairSpec(
            name=f"{vocab}-{dtype}-{quant}",
            target=ModelSpec(str(target), quant=quant, dtype=dtype),
            draft=ModelSpec(str(draft), dtype=dtype),
            head=str(head),
            ngram=NgramSpec(1, 3),
            k=K,
            default_proposer="draft",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                _LOADED[key] = ChatSession(load_pair(pair, device="cpu"))
            except ConfigError as exc:
                _LOADED[key] = exc
    return _LOADED[key]


def _ids(session, proposer, sampling):
    spec = SpecConfig(proposer=proposer, k=K, sampler="auto", adaptive=False)
    events = list(session.stream_ids(list(PROMPT), sampling, spec, None))
    assert events[-1].finish_reason in ("length", "stop"), events[-1].error
    return [t.token_id for e in events for t in e.tokens], events[-1].stats


def _check_greedy(session, ids, plain, guarantee):
    if ids == plain:
        return
    assert guarantee.greedy == "near-tie", f"greedy output differs from plain decoding: {ids} vs {plain}"
    pairs = enumerate(zip(ids, plain, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(ids), len(plain)))  # the first flip
    runner = ModelRunner(session.loaded.target)
    runner.reset()
    logits = runner.extend(list(PROMPT) + plain[:at], logits_to_keep=1).logits[-1].float()
    top2 = torch.topk(logits, 2).values
    gap = float(top2[0] - top2[1])
    assert gap < guarantee.flip_bound, (
        f"greedy flip at token {at} where the target's top-2 gap is {gap:.3g} (bound {guarantee.flip_bound})"
    )


def _chi_square(session, proposer_name):
    """p-values at temperature 1 on the cell's own distributions (see the module docstring)."""
    sampling = SamplingParams(temperature=1.0)
    noise = DraftNoise(torch.Generator().manual_seed(7))
    runner = ModelRunner(session.loaded.target)
    runner.reset()
    proposer = session.make_proposer(SpecConfig(proposer=proposer_name, k=K))
    wants = proposer is not None and proposer.wants_hidden
    hidden = runner.extend(list(PROMPT[:-1]), want_hidden=wants, logits_to_keep=0).hidden
    draft_ids, draft_probs = [], None
    if proposer is not None:
        proposer.begin(list(PROMPT), hidden)
        draft = proposer.propose(list(PROMPT), K, sampling, noise)
        draft_ids, draft_probs = list(draft.token_ids), draft.probs
    logits = runner.extend([PROMPT[-1]] + draft_ids).logits.float()  # [k+1, V]
    vocab = logits.shape[-1]
    support = [torch.topk(logits, 128, dim=-1).indices.flatten(), torch.tensor(draft_ids, dtype=torch.long)]
    if draft_probs is not None:
        support.append(torch.topk(draft_probs, 64, dim=-1).indices.flatten())
    draft_rows = (
        session.loaded.draft.get_output_embeddings().weight.shape[0] if session.loaded.draft is not None else vocab
    )
    if draft_rows < vocab:
        support.append(torch.arange(draft_rows, draft_rows + 16))  # ids only the target has
    support = torch.unique(torch.cat(support))
    target_probs = torch.softmax(logits[:, support], -1)
    _, sampler = get_verifier("auto", "cpu")
    if not draft_ids:  # plain decoding: K = 0
        from localspec.verify.types import make_draws

        n = 20000
        draws = make_draws(torch.Generator().manual_seed(1), n, 0, len(support), "cpu")
        out = sampler(target_probs.log().expand(n, 1, -1), torch.zeros((n, 0), dtype=torch.long), None, sampling, draws)
        return (chi_square_p(torch.bincount(out.output_token_ids[:, 0], minlength=len(support)), target_probs[0]),)
    sub_draft = None
    if draft_probs is not None:
        sub_draft = draft_probs[:, support]
        sub_draft = sub_draft / sub_draft.sum(-1, keepdim=True)
    return emitted_distribution_pvalues(sampler, target_probs, sub_draft, sampling, samples=20000, seed=3)[:3]


@pytest.mark.parametrize("vocab,dtype,quant,proposer", list(_cells()))
def test_configuration(family_folders, vocab, dtype, quant, proposer):
    session = _session(family_folders, vocab, dtype, quant)
    if isinstance(session, ConfigError):
        message = str(session)
        # a refusal by design names the entry and the field; any other load failure fails the cell
        assert f"model pair '{vocab}-{dtype}-{quant}'" in message, message
        assert "target.quant" in message or "target.dtype" in message, message
        pytest.skip(f"refused: {message}")
    assert session.loaded.notices == (), session.loaded.notices  # every part loads in every cell
    assert proposer in session.proposers
    guarantee = guarantee_for(dtype, quant, "cpu")
    plain, _ = _ids(session, "none", SamplingParams(max_new_tokens=12))
    ids, stats = _ids(session, proposer, SamplingParams(max_new_tokens=12))
    _check_greedy(session, ids, plain, guarantee)
    if proposer in ("ngram", "draft", "ngram+head"):
        assert stats.drafted > 0
    sampled, _ = _ids(session, proposer, SamplingParams(temperature=1.0, max_new_tokens=8, seed=2))
    assert len(sampled) == 8
    pvalues = _chi_square(session, proposer)
    assert min(pvalues) > P_MIN, pvalues
