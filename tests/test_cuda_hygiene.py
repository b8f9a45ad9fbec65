"""CUDA hygiene written and tested on the CPU with torch.cuda mocked (issue 16): the 'auto' sampler's warm-up and
fallback, synced step timing, freeing the old pair on a switch that would not fit, device_map from the entry."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from localspec.config import ModelSpec
from localspec.verify import AUTO_FALLBACK, get_verifier, rejection_sample


@pytest.fixture(autouse=True)
def _clean_fallback():
    AUTO_FALLBACK.clear()
    yield
    AUTO_FALLBACK.clear()


def _patch_auto(monkeypatch, verify):
    from localspec.verify import warmup

    calls = []

    def counted(logits, draft_ids, *args):
        calls.append(draft_ids.shape[1])
        return verify(logits, draft_ids, *args)

    monkeypatch.setattr(warmup, "get_verifier", lambda name, device: ("triton", counted))
    return warmup, calls


def test_a_failing_kernel_falls_back_to_torch_with_a_notice(monkeypatch):
    def broken(*args):
        raise RuntimeError("PTX compile failed")

    warmup, _ = _patch_auto(monkeypatch, broken)
    notice = warmup.warm_up_sampler(torch.device("cpu"), 4)
    assert "PTX compile failed" in notice and "using the torch sampler" in notice
    assert "cpu" in AUTO_FALLBACK


def test_a_kernel_that_disagrees_with_the_reference_falls_back(monkeypatch):
    def wrong(logits, draft_ids, draft_probs, sampling, draws):
        out = rejection_sample(logits, draft_ids, draft_probs, sampling, draws)
        return replace(out, num_accepted=out.num_accepted * 0 + draft_ids.shape[1] + 1)

    warmup, _ = _patch_auto(monkeypatch, wrong)
    assert "disagrees with the torch reference" in warmup.warm_up_sampler("cpu", 3)


def test_a_working_kernel_is_warmed_at_k0_and_k(monkeypatch):
    from localspec.verify.triton_fused import fused_rejection_sample  # interpreted on the CPU

    warmup, calls = _patch_auto(monkeypatch, fused_rejection_sample)
    assert warmup.warm_up_sampler("cpu", 3) is None
    assert sorted(set(calls)) == [0, 3] and not AUTO_FALLBACK


def test_auto_on_a_fallen_back_device_is_torch():
    cuda = torch.device("cuda")
    assert get_verifier("auto", cuda)[0] == "triton"  # the kernel imports here (interpreted)
    AUTO_FALLBACK[str(cuda)] = "RuntimeError: launch failed"
    assert get_verifier("auto", cuda)[0] == "torch"
    assert get_verifier("triton", cuda)[0] == "triton"  # asked for by name: no silent switch


def test_step_timing_syncs_on_cuda(monkeypatch):
    from localspec.runtime.timing import synced_clock

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    synced_clock(torch.device("cpu"))
    assert synced == []
    synced_clock(torch.device("cuda:1"))
    assert synced == [torch.device("cuda:1")]


@pytest.mark.parametrize("free,expect_freed", [(1 << 10, True), (1 << 40, False)])
def test_a_switch_frees_the_old_pair_first_when_both_do_not_fit(monkeypatch, tiny_session, free, expect_freed):
    from localspec.models import memory
    from localspec.ui.manager import ModelManager

    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (free, 1 << 40))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 1 << 30)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    first = tiny_session.loaded.spec
    second = replace(first, name="second", target=ModelSpec("some/hub-model"))  # size unknown: as large as the old
    old_session_at_load = []

    def factory(pair, progress):
        old_session_at_load.append(manager.session)
        return tiny_session

    manager = ModelManager([first, second], factory)
    manager.load(first.name)
    manager.load("second")
    assert (old_session_at_load[1] is None) == expect_freed
    assert emptied and manager.name == "second"
    assert memory.estimated_bytes(first) > 0  # a local folder's size is read from its files


def test_device_map_from_the_entry_reaches_from_pretrained(monkeypatch):
    from transformers import AutoModelForCausalLM

    from localspec.models import loading
    from localspec.models.registry import parse_registry

    seen = {}

    class Fake(torch.nn.Module):
        def to(self, *args, **kwargs):
            raise AssertionError("a device_map model is placed by accelerate, never moved")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda folder, **kw: seen.update(kw) or Fake())
    monkeypatch.setattr(loading, "resolve_folder", lambda spec, what, progress=None: "/nowhere")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    pair = parse_registry("- name: big\n  target: {source: owner/big, device_map: auto}\n", "/")[0]
    assert pair.target.device_map == "auto" and pair.target.dtype == "auto"
    loading.load_causal_lm(pair.target, "target", torch.device("cuda"), "target")
    assert seen["device_map"] == "auto" and seen["dtype"] == torch.bfloat16  # auto: bf16 on CUDA, not fp32
