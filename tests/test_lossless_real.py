"""Greedy losslessness on the real embedded model (SmolLM2-135M-Instruct) over prompts from ../shared/data.

Each path is held to exactly its stated guarantee (localspec/verify/guarantee.py): speculative greedy output equals
plain decoding, except at a first parting position whose top-2 logit gap is below the path's measured flip bound."""

import pytest
import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.verify.guarantee import cpu_family, guarantee_for_model

from .conftest import shared_prompts
from .lossless import assert_within_guarantee

pytestmark = pytest.mark.slow
NEW_TOKENS = 32
KS = (1, 3, 5, 8)


def ids_of(session, prompt_ids, spec):
    events = session.stream_ids(prompt_ids, SamplingParams(max_new_tokens=NEW_TOKENS), spec)
    return [t.token_id for e in events for t in e.tokens]


@pytest.fixture(scope="module")
def prompts(embedded_session):
    texts = shared_prompts(limit_mt=3, limit_code=2)
    assert len(texts) >= 5
    return [embedded_session.prompt_ids([{"role": "user", "content": t}], NEW_TOKENS)[0] for t in texts]


def test_speculative_equals_transformers_generate(embedded_session, prompts):
    model = embedded_session.loaded.target
    stop = sorted(embedded_session.engine.stop_token_ids)
    for n, prompt_ids in enumerate(prompts):
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt_ids]),
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                eos_token_id=stop,
                pad_token_id=stop[0],
            )
        expected = out[0, len(prompt_ids) :].tolist()
        baseline = ids_of(embedded_session, prompt_ids, SpecConfig(proposer="none"))
        assert_within_guarantee(embedded_session, prompt_ids, expected, baseline, f"prompt {n} none", exact=False)
        for k in KS:  # speculation against our own plain decoding: the loaded path's guarantee (== when exact)
            got = ids_of(embedded_session, prompt_ids, SpecConfig(proposer="ngram", k=k))
            assert_within_guarantee(embedded_session, prompt_ids, baseline, got, f"prompt {n} ngram K={k}")


def embedded_as(dtype: str, quant: str = "none", exact: str = "on"):
    """A session on the embedded model loaded as `quant` in `dtype`, with the exact setup on or off."""
    import dataclasses
    from pathlib import Path

    from localspec.chat import ChatSession
    from localspec.config import ModelSpec
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    pair = load_registry(Path(__file__).resolve().parents[1] / "models.yaml")[0]
    target = ModelSpec(pair.target.source, quant, dtype, pair.target.trust_remote_code)
    loaded = load_pair(dataclasses.replace(pair, target=target), device="cpu", load_draft=False, exact=exact)
    return ChatSession(loaded)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_exact_forwards_give_plain_decodings_greedy_tokens_on_every_cpu_dtype(dtype):
    """Each CPU dtype explicitly (not only what dtype: auto picks here): with the exact setup, greedy n-gram chains
    of every K and n-gram token trees are plain decoding's tokens (== where the path is measured identical, else
    within its bound), and seeded sampling is plain seeded sampling for another K, under adaptive K and with trees.
    Where the attention kernel loads (the kernels' library builds here) the exact setup runs on it, and on the CPU
    family it was measured on every path is stated identical, chains and trees."""
    session = embedded_as(dtype)
    assert session.engine.target.setup.padded(1) > 1  # the exact setup is what runs
    stated = guarantee_for_model(session.loaded.target, "none", "cpu", exact=True)
    if session.engine.target.setup.attention_kernel and cpu_family() == "amd-epyc":
        assert stated.greedy == "identical" and stated.tree_greedy == "identical", stated.text
    tree = SpecConfig(proposer="ngram", k=4, tree_nodes=8)
    for n, text in enumerate(shared_prompts(limit_mt=1, limit_code=1)):
        prompt_ids = session.prompt_ids([{"role": "user", "content": text}], NEW_TOKENS)[0]
        baseline = ids_of(session, prompt_ids, SpecConfig(proposer="none"))
        for k in KS:
            got = ids_of(session, prompt_ids, SpecConfig(proposer="ngram", k=k))
            assert_within_guarantee(session, prompt_ids, baseline, got, f"{dtype} prompt {n} ngram K={k}")
        got = ids_of(session, prompt_ids, tree)
        assert_within_guarantee(session, prompt_ids, baseline, got, f"{dtype} prompt {n} ngram tree", tree=True)
        if stated.greedy != "identical":
            continue  # seeded equality needs bitwise-equal logits
        sampled = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=42)
        plain = session.stream_ids(prompt_ids, sampled, SpecConfig(proposer="none"))
        plain_ids = [t.token_id for e in plain for t in e.tokens]
        specs = [SpecConfig(proposer="ngram", k=3), SpecConfig(proposer="ngram", k=4, adaptive=True)]
        for spec in specs + ([tree] if stated.tree_greedy == "identical" else []):
            events = session.stream_ids(prompt_ids, sampled, spec)
            assert [t.token_id for e in events for t in e.tokens] == plain_ids, f"{dtype} prompt {n} seeded {spec}"


def check_speculative_equals_plain(dtype: str, quant: str, limit_mt: int, limit_code: int, ks=KS, exact="off"):
    session = embedded_as(dtype, quant, exact)  # exact off: the fast setup, its measured bound
    up_proj = session.loaded.target.model.layers[0].mlp.up_proj
    if quant == "gguf":
        from localspec.models.gguf_linear import Int4Linear

        assert isinstance(up_proj, Int4Linear)
    elif quant != "none":
        assert "bitsandbytes" in type(up_proj).__module__
    stated = guarantee_for_model(session.loaded.target, quant, "cpu", exact=exact == "on")
    assert stated.measured, stated.text
    for n, text in enumerate(shared_prompts(limit_mt=limit_mt, limit_code=limit_code)):
        prompt_ids = session.prompt_ids([{"role": "user", "content": text}], NEW_TOKENS)[0]
        baseline = ids_of(session, prompt_ids, SpecConfig(proposer="none"))
        for k in ks:
            got = ids_of(session, prompt_ids, SpecConfig(proposer="ngram", k=k))
            assert_within_guarantee(session, prompt_ids, baseline, got, f"{quant}/{dtype} prompt {n} ngram K={k}")
        if exact == "on":
            got = ids_of(session, prompt_ids, SpecConfig(proposer="ngram", k=4, tree_nodes=8))
            assert_within_guarantee(session, prompt_ids, baseline, got, f"{quant}/{dtype} prompt {n} tree", tree=True)
    return stated


def test_nf4_speculative_equals_nf4_plain():
    check_speculative_equals_plain("float32", "nf4", limit_mt=2, limit_code=1)


def test_nf4_exact_forwards_give_nf4_plain_decodings_tokens_chains_and_trees():
    """bitsandbytes' nf4 linears with float32's dummy rows and the attention kernel: measured bitwise (chains and
    trees on the AVX-512 EPYC, assets/rounding/epyc/nf4-attention-kernel.json), so == there wherever the kernel
    loads; elsewhere the exact setup's bound."""
    stated = check_speculative_equals_plain("float32", "nf4", limit_mt=1, limit_code=1, ks=(3, 5), exact="on")
    if "attention kernel" in stated.path and cpu_family() == "amd-epyc":
        assert stated.greedy == "identical" and stated.tree_greedy == "identical"


def test_int8_speculative_equals_int8_plain():
    check_speculative_equals_plain("float32", "int8", limit_mt=2, limit_code=1, ks=(3, 5))


def test_bfloat16_speculative_equals_bfloat16_plain():
    check_speculative_equals_plain("bfloat16", "none", limit_mt=2, limit_code=1, ks=(3, 5))


def test_gguf_speculative_equals_gguf_plain():
    check_speculative_equals_plain("bfloat16", "gguf", limit_mt=2, limit_code=1, ks=(3, 5))
