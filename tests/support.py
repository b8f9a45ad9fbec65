"""Helpers shared by the test modules (no test module imports another): prompts, a random feature head for a tiny
target, the token-span kinds of a transcript, the one polling helper, and a forward with and without the layer
kernel."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from localspec.heads.config import HeadConfig, target_shapes
from localspec.heads.model import FeatureHead

T = TypeVar("T")

COUNTING_PROMPT = list(range(5, 45))  # 40 distinct ids: nothing repeats for the n-gram lookup
HELLO_PROMPT = [1, 72, 101, 108, 108, 111, 44, 32, 119]  # "Hello, w"
HELLO_HELLO_PROMPT = [1, 72, 101, 108, 108, 111, 44, 32, 119, 72, 101, 108, 108, 111]  # "Hello, wHello": a repeat
DRAFT_VOCAB = 200  # a random head's draft vocabulary


def make_head(target, kind: str, modules: int = 1, seed: int = 0, feature_layers: tuple = ()) -> FeatureHead:
    """A random head over `target`; with feature_layers, its projection is random too (every layer's features
    count)."""
    torch.manual_seed(seed)
    config = HeadConfig(
        kind=kind,
        num_modules=modules,
        draft_vocab_size=DRAFT_VOCAB,
        feature_layers=feature_layers,
        **target_shapes(target.config),
    )
    head = FeatureHead(config, target.get_input_embeddings().weight)
    head.set_lm_weight(target.get_output_embeddings().weight)
    head.set_draft_vocab(torch.randperm(config.vocab_size, generator=torch.Generator().manual_seed(seed))[:DRAFT_VOCAB])
    for module in head.layers:
        module.init_from_target_layer(target.model.layers[-1])
    if feature_layers:
        head.init_feature_proj()
        with torch.no_grad():
            head.feature_proj.weight.add_(torch.randn_like(head.feature_proj.weight) * 0.2)
    return head.eval()


def span_kinds(transcript: str) -> list[str]:
    """The token kinds of a rendered transcript's spans, in order."""
    return re.findall(r'class="tok tok-(\w+)', transcript)


def wait_until(
    predicate: Callable[[], T], timeout_s: float, what: str = "condition", every_s: float = 0.05, fail: bool = True
) -> T:
    """Call predicate every `every_s` seconds until it returns something truthy, and return that. After timeout_s:
    an AssertionError naming `what` (fail), or the last value (fail False: the caller asserts on it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            break
        time.sleep(every_s)
    if not value and fail:
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
    return value


def layer_kernel_logits(target, prompt: list[int], new: list[int]):
    """The exact setup's lean forward of `new` after `prompt`, with the layer kernel and with the torch-op layers
    around the same kernels: (logits on the kernel [T, V], logits of the torch ops [T, V], layer-kernel calls)."""
    import pytest

    from localspec.runtime import layer_kernel
    from localspec.runtime.lean_llama import backbone_for
    from localspec.runtime.model_runner import ModelRunner, exact_setup_for
    from localspec.runtime.plan import plan_forward

    runner = ModelRunner(target, compile="off", setup=exact_setup_for(target), forward="lean")
    layers = backbone_for(target, plan_forward(target, forward="lean"))[1].layers
    runner.reset()
    runner.extend(prompt, logits_to_keep=0)
    calls, run = [], layer_kernel.BoundLayer.run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layer_kernel.BoundLayer, "run", lambda self, *a: calls.append(1) or run(self, *a))
        on_kernel = runner.extend(new).logits
    runner.crop(len(prompt))
    bound = [layer.layer_kernel for layer in layers]
    try:
        for layer in layers:
            layer.layer_kernel = None
        torch_ops = runner.extend(new).logits
    finally:
        for layer, kernel in zip(layers, bound, strict=True):
            layer.layer_kernel = kernel
    return on_kernel, torch_ops, len(calls)
