"""The forward plan (runtime/plan.py): one table of kernels per block type, every choice made in the plan's module
with its reason, and the runner executing the plan it is given."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from localspec.config import Environment
from localspec.runtime.plan import KERNELS, LoadRecord, exact_cost, plan_forward, record_load, tensor_kernel

REPO = Path(__file__).resolve().parents[1]


class _Library:
    """A stand-in for runtime/library.KernelLibrary with every member present."""

    q4 = q8 = attention = layer = object()
    notes = ()
    isa = "avx2"


def test_each_block_type_is_a_row_of_one_table():
    assert tensor_kernel("Q4_1", "linear", _Library()).value == "q4"
    assert tensor_kernel("Q4_1", "linear", None, "turned off").value == "torch-int4"
    assert "turned off" in tensor_kernel("Q4_1", "linear", None, "turned off").reason
    assert tensor_kernel("Q8_0", "lm_head", _Library()).value == "q8"
    assert tensor_kernel("Q8_0", "linear", _Library()).value == "q8"
    assert tensor_kernel("Q4_0", "linear", _Library()).value == "q4"  # the q4 layout with m = −8·d
    assert tensor_kernel("Q5_0", "linear", _Library()).value == "q8"  # codes q − 16 fit int8
    assert tensor_kernel("Q5_0", "lm_head", _Library()).value == "dense"  # a role its row does not serve
    assert tensor_kernel("Q6_K", "linear", _Library()).value == "q6k"  # int8 codes q − 32, the file's d and sc
    assert tensor_kernel("Q4_K", "linear", _Library()).value == "q4k"  # the q4 layout, the file's own scales
    assert tensor_kernel("Q3_K", "linear", _Library()).value == "dense"  # no row: the dequantized weight
    assert all(row.kernel in ("q4", "q4k", "q6k", "q8", "q8k") and row.why for row in KERNELS.values())


def test_the_kernel_and_setup_choices_live_in_the_plans_module_only():
    """Where the choices are defined: a second definition elsewhere would be a second place deciding."""
    decisions = re.compile(
        r"^(def (exact_setup_for|exact_setup|lean_supported|tensor_kernel|row_invariant_layers|setup_id|packing)\(|"
        r"(EXACT_ROWS|KERNELS|FAST|Setup) = )",
        re.M,
    )
    where = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "localspec").rglob("*.py")
        if decisions.search(path.read_text(encoding="utf-8"))
    }
    assert where == {"localspec/runtime/plan.py"}, where


def _tiny(dtype=torch.bfloat16):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype).eval()


def test_a_plan_states_every_choice_with_its_reason_and_the_setup_id_follows_what_runs():
    model = _tiny()
    fast, exact = plan_forward(model), plan_forward(model, exact=True)
    assert fast.setup_id == "fast" and fast.dummy_rows.value == "no dummy rows"
    assert exact.setup_id == "exact" and exact.dummy_rows.value == "≥ 2 rows"  # no library offered: eager
    assert exact.decode_attention.value == "eager"
    assert exact_cost(exact).value == "timed" and "timed once per machine" in exact_cost(exact).reason
    described = exact.to_dict()
    assert described["summary"] == exact.summary() and exact.summary().startswith("exact: lean forward")
    for name in ("library", "lm_head", "decode_attention", "prefill_attention", "dummy_rows", "layer_kernel"):
        assert described[name]["value"] and described[name]["reason"], name
    transformers = plan_forward(model, exact=True, env=Environment.read({"LOCALSPEC_FORWARD": "transformers"}))
    assert transformers.forward == "transformers" and transformers.prefill_attention.value == "eager"
    compiled = plan_forward(model, env=Environment.read({"LOCALSPEC_COMPILE": "reduce-overhead"}))
    assert compiled.compile == "reduce-overhead" and compiled.forward == "transformers"  # CUDA graphs: no lean


def test_an_offered_library_puts_decode_attention_on_its_kernel_and_the_runner_runs_the_plan():
    from localspec.models.gguf_linear import library_here_now
    from localspec.runtime.model_runner import ModelRunner

    library = library_here_now().library
    if library is None or library.attention is None:
        pytest.skip("no attention kernel here")
    model = _tiny()
    record_load(model, LoadRecord(library))
    plan = plan_forward(model, exact=True)
    assert plan.setup_id == "exact-attention" and plan.decode_attention.value == "kernel"
    assert plan.layer_kernel.value == "off" and "q4" in plan.layer_kernel.reason  # dense linears
    assert exact_cost(plan).value == "timed"  # torch's linears: exact: auto times the exact setup
    assert plan_forward(model, exact=True, env=Environment.read({"LOCALSPEC_FORWARD": "transformers"})).setup_id == (
        "exact"
    )
    runner = ModelRunner(model, plan=plan)
    assert runner.plan is plan and runner.setup is plan.setup and runner.forward_kind == "lean"
    runner.reset()
    assert runner.extend(list(range(10, 20))).logits.shape == (10, 256)
