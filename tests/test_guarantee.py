"""The per-path greedy guarantee: read from the measured rounding (verify/guarantee.py), refused for unknown paths."""

import math

import pytest

from localspec.config import ConfigError
from localspec.verify.greedy_check import compare_greedy, first_difference
from localspec.verify.guarantee import MARGIN_FACTOR, MEASURED, MEASURED_BY_CPU, guarantee_for


def _measured():
    for (device, dtype, quant, setup), rounding in MEASURED.items():
        yield guarantee_for(dtype, quant, device, setup, cpu="other"), rounding
    for (device, dtype, quant, setup, family), rounding in MEASURED_BY_CPU.items():
        yield guarantee_for(dtype, quant, device, setup, cpu=family), rounding


def test_each_measured_path_states_identical_or_its_flip_gap_plus_the_margin():
    for stated, rounding in _measured():
        assert stated.measured and stated.measured_on in stated.text
        if rounding.unequal == 0:  # every row bitwise equal: asserted ==, no bound
            assert stated.greedy == "identical" and stated.flip_bound == 0.0 and not stated.allows_flip(0.0)
            assert stated.short == "bitwise identical to plain decoding"
        else:
            assert stated.greedy == "near-tie"
            assert stated.flip_bound == rounding.max_flip_gap + MARGIN_FACTOR * rounding.max_abs_diff
            assert rounding.max_flip_gap < stated.flip_bound  # every flip measured lies below the stated bound
            assert f"{stated.flip_bound:.2g}" in stated.text and f"{stated.flip_bound:.2g}" in stated.short


def test_the_exact_setup_is_identical_where_it_was_measured_so_and_says_where_not():
    """bfloat16 and gguf: chains bitwise equal in the exact setup on the AMD EPYC, not in the fast one (the remedy is
    what makes them equal); on the Sapphire Rapids Xeon the exact setup's chains were not all equal, and the
    guarantee read there says so."""
    for quant in ("none", "gguf"):
        assert guarantee_for("bfloat16", quant, "cpu", "exact", cpu="amd-epyc").greedy == "identical"
        assert guarantee_for("bfloat16", quant, "cpu", "fast", cpu="amd-epyc").greedy == "near-tie"
        on_xeon = guarantee_for("bfloat16", quant, "cpu", "exact", cpu="intel-xeon")
        assert on_xeon.greedy == "near-tie" and "Xeon" in on_xeon.measured_on


def test_the_row_invariant_kernels_make_chains_and_trees_identical_on_every_cpu_family():
    for family in ("amd-epyc", "intel-xeon", "other"):
        stated = guarantee_for("bfloat16", "gguf", "cpu", "exact-kernels", cpu=family)
        assert stated.greedy == "identical" and stated.tree_greedy == "identical" and stated.tree_flip_bound == 0.0
        assert "row-invariant kernels" in stated.path and "token trees too" in stated.text


def test_the_attention_kernel_makes_every_cpu_path_but_int8_identical_for_chains_and_trees():
    """Measured: with decode / verify attention on the attention kernel, bf16, float32, float16 and nf4 rows were all
    plain decoding's (the exact setup without it left them unequal, but bf16 chains); int8's outlier columns keep
    it near-tie."""
    for dtype, quant in (("bfloat16", "none"), ("float32", "none"), ("float16", "none"), ("float32", "nf4")):
        stated = guarantee_for(dtype, quant, "cpu", "exact-attention", cpu="amd-epyc")
        assert stated.greedy == "identical" and stated.tree_greedy == "identical", (dtype, quant)
        assert "attention kernel" in stated.path and "linears as measured" in stated.text
        without = guarantee_for(dtype, quant, "cpu", "exact", cpu="amd-epyc")
        assert without.tree_greedy == "near-tie" and without.tree_flip_bound > 0
    int8 = guarantee_for("float32", "int8", "cpu", "exact-attention", cpu="amd-epyc")
    assert int8.greedy == "near-tie" and int8.flip_bound > 1


def test_a_cpu_family_the_attention_kernel_was_not_measured_on_reads_the_exact_setups_measurement():
    """On the Xeon the exact setup on eager attention was measured inexact; the kernel is not measured there, so
    its guarantee is the eager setup's (the kernel removes attention's differences, never adds any)."""
    on_xeon = guarantee_for("bfloat16", "none", "cpu", "exact-attention", cpu="intel-xeon")
    eager = guarantee_for("bfloat16", "none", "cpu", "exact", cpu="intel-xeon")
    assert on_xeon.greedy == eager.greedy == "near-tie" and on_xeon.flip_bound == eager.flip_bound
    assert "not measured on this CPU" in on_xeon.text and on_xeon.measured
    elsewhere = guarantee_for("float32", "none", "cpu", "exact-attention", cpu="other")
    assert elsewhere.flip_bound == guarantee_for("float32", "none", "cpu", "exact", cpu="other").flip_bound


def test_an_unknown_setup_is_refused():
    with pytest.raises(ConfigError, match="forward setup"):
        guarantee_for("bfloat16", "none", "cpu", "exactish")


def test_unmeasured_paths_say_so_and_claim_no_bound():
    stated = guarantee_for("bfloat16", "nf4", "cuda")
    assert not stated.measured and stated.measured_on == "not measured" and "not measured" in stated.text
    assert math.isinf(stated.flip_bound) and stated.to_dict()["flip_bound"] is None


@pytest.mark.parametrize(
    "args, word",
    [
        (("float8", "none", "cpu"), "dtype"),
        (("float32", "gptq", "cpu"), "quant"),
        (("float32", "none", "mps"), "device"),
    ],
)
def test_unknown_paths_are_refused_with_a_message(args, word):
    with pytest.raises(ConfigError, match=word):
        guarantee_for(*args)


def test_a_flip_is_allowed_only_below_the_bound(tiny_models, monkeypatch):
    import localspec.verify.greedy_check as check

    target, _draft = tiny_models
    stated = guarantee_for("float32", "none", "cpu")  # fast forwards: a near-tie bound
    assert stated.greedy == "near-tie"
    assert first_difference([1, 2, 3], [1, 2, 3]) is None and first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert compare_greedy(target, [1, 2, 3], [4, 5], [4, 5], stated).ok
    monkeypatch.setattr(check, "plain_top2_gap", lambda *_: stated.flip_bound / 2)
    assert compare_greedy(target, [1, 2, 3], [4, 5], [4, 6], stated).ok
    monkeypatch.setattr(check, "plain_top2_gap", lambda *_: stated.flip_bound)
    result = compare_greedy(target, [1, 2, 3], [4, 5], [4, 6], stated)
    assert not result.ok and result.at == 1 and "not below" in result.detail


def test_plain_top2_gap_reads_plain_decodings_logits(tiny_models):
    import torch

    from localspec.verify.greedy_check import plain_top2_gap

    target, _draft = tiny_models
    with torch.inference_mode():
        logits = target(torch.tensor([[1, 5, 9, 13]])).logits[0, -1]
    top = torch.topk(logits, 2).values
    assert plain_top2_gap(target, [1, 5, 9], [13, 40], 1) == pytest.approx(float(top[0] - top[1]), abs=1e-4)
