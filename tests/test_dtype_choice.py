"""dtype: auto on the tiny pair: measured once per machine and model, cached, reused; the explicit dtype wins."""

from __future__ import annotations

import json

import pytest
import torch

from localspec.models import dtype_choice
from localspec.models.loading import load_pair
from localspec.models.registry import parse_registry


class FakeTimer:
    """Seconds per forward by dtype (bfloat16 faster unless told otherwise); counts the models it timed."""

    def __init__(self, plain: dict[str, float], verify_ratio: float = 1.2) -> None:
        self.plain = plain
        self.verify_ratio = verify_ratio
        self.timed: list[str] = []

    def __call__(self, models, sizes, setups=None):
        """The dtype decision times each candidate under its dtype's name; anything else (a session timing its
        engine's own setup, models named "target") is timed by its dtype and not counted."""
        out = {}
        for name, model in models.items():
            dtype = str(model.dtype).removeprefix("torch.")
            if setups is None:
                assert dtype == name
                self.timed.append(name)
            out[name] = {size: self.plain[dtype] * (1 if size == 1 else self.verify_ratio) for size in sizes}
        return out


def _pair(tiny_pair, dtype: str):
    text = f"- name: tiny\n  target: {{source: {tiny_pair['target']}, dtype: {dtype}}}\n  k: 3\n"
    return parse_registry(text, tiny_pair["root"])[0]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dtype_choice, "candidates", lambda device: ["float32", "bfloat16"])
    return tmp_path / "home"


def _use(monkeypatch, timer):
    monkeypatch.setattr(dtype_choice, "time_forwards", timer)


def test_auto_measures_once_then_reuses_the_cached_decision(tiny_pair, home, monkeypatch):
    timer = FakeTimer({"float32": 0.040, "bfloat16": 0.020})
    _use(monkeypatch, timer)
    first = load_pair(_pair(tiny_pair, "auto"), device="cpu")
    assert timer.timed == ["float32", "bfloat16"]
    assert first.dtype.how == "measured" and first.dtype.dtype == "bfloat16"
    assert next(first.target.parameters()).dtype == torch.bfloat16  # the chosen dtype is what runs
    assert "1-token 20 ms vs 40 ms float32" in first.dtype.describe()
    assert (home / "cache" / dtype_choice.CACHE_FILE).exists()

    second = load_pair(_pair(tiny_pair, "auto"), device="cpu")
    assert timer.timed == ["float32", "bfloat16"]  # nothing timed again
    assert second.dtype.how == "cached" and second.dtype.dtype == "bfloat16"
    assert next(second.target.parameters()).dtype == torch.bfloat16


def test_auto_picks_float32_when_it_is_faster(tiny_pair, home, monkeypatch):
    _use(monkeypatch, FakeTimer({"float32": 0.020, "bfloat16": 0.035}))
    loaded = load_pair(_pair(tiny_pair, "auto"), device="cpu")
    assert loaded.dtype.dtype == "float32"
    assert next(loaded.target.parameters()).dtype == torch.float32


def test_cost_model_weighs_the_verify_step_not_only_the_plain_step():
    # float32 has the faster plain step, but its 4-token verify costs 3x: at acceptance 0.5 bfloat16 predicts more
    fp32 = dtype_choice.predicted_throughput(0.020, 0.060, 3)
    bf16 = dtype_choice.predicted_throughput(0.022, 0.023, 3)
    assert bf16 > fp32
    assert fp32 == pytest.approx(1 / 0.020)  # speculation is predicted to lose in float32: plain decoding's rate


def test_explicit_dtype_wins_and_times_nothing(tiny_pair, home, monkeypatch):
    timer = FakeTimer({"float32": 0.040, "bfloat16": 0.020})
    _use(monkeypatch, timer)
    loaded = load_pair(_pair(tiny_pair, "float32"), device="cpu")
    assert timer.timed == []
    assert loaded.dtype.how == "entry" and loaded.dtype.describe() == "float32 (set in models.yaml)"
    assert next(loaded.target.parameters()).dtype == torch.float32


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 1, "decisions": []}), "KEY-BAD-DTYPE"])
def test_a_broken_cache_file_is_measured_again(tiny_pair, home, monkeypatch, content):
    timer = FakeTimer({"float32": 0.040, "bfloat16": 0.020})
    _use(monkeypatch, timer)
    load_pair(_pair(tiny_pair, "auto"), device="cpu")
    path = home / "cache" / dtype_choice.CACHE_FILE
    if content == "KEY-BAD-DTYPE":  # a well-formed file whose entry names a dtype that was never measured
        data = json.loads(path.read_text())
        for record in data["decisions"].values():
            record["dtype"] = "int3"
        content = json.dumps(data)
    path.write_text(content)
    timer.timed.clear()
    loaded = load_pair(_pair(tiny_pair, "auto"), device="cpu")
    assert timer.timed == ["float32", "bfloat16"]
    assert loaded.dtype.how == "measured" and loaded.dtype.dtype == "bfloat16"
    assert json.loads(path.read_text())["version"] == dtype_choice.CACHE_VERSION  # rewritten whole


def test_the_cache_is_keyed_by_model_and_torch_version(tiny_pair, home, monkeypatch):
    timer = FakeTimer({"float32": 0.040, "bfloat16": 0.020})
    _use(monkeypatch, timer)
    load_pair(_pair(tiny_pair, "auto"), device="cpu")
    draft = f"- name: d\n  target: {{source: {tiny_pair['draft']}, dtype: auto}}\n  k: 3\n"
    load_pair(parse_registry(draft, tiny_pair["root"])[0], device="cpu")
    assert len(timer.timed) == 4  # another model: measured on its own
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    load_pair(_pair(tiny_pair, "auto"), device="cpu")
    assert len(timer.timed) == 6


def test_the_real_timer_times_every_model_and_size(tiny_models):
    target, draft = tiny_models
    times = dtype_choice.time_forwards({"target": target, "draft": draft}, (1, 4))
    assert set(times) == {"target", "draft"}
    assert all(set(by_size) == {1, 4} and all(t > 0 for t in by_size.values()) for by_size in times.values())


def test_a_dtype_with_non_finite_logits_is_not_a_candidate(tiny_pair, home, monkeypatch):
    timer = FakeTimer({"float32": 0.040, "bfloat16": 0.020})

    def bfloat16_overflows(models, sizes):
        return {name: by_size for name, by_size in timer(models, sizes).items() if name != "bfloat16"}

    _use(monkeypatch, bfloat16_overflows)
    loaded = load_pair(_pair(tiny_pair, "auto"), device="cpu")
    assert loaded.dtype.dtype == "float32" and [t.dtype for t in loaded.dtype.timings] == ["float32"]


def test_runtime_header_and_generate_json_say_which_dtype_and_why(tiny_pair, home, monkeypatch):
    from localspec.chat import ChatSession
    from localspec.ui.runtime import runtime_of

    _use(monkeypatch, FakeTimer({"float32": 0.040, "bfloat16": 0.020}))
    session = ChatSession(load_pair(_pair(tiny_pair, "auto"), device="cpu"))
    header = runtime_of(session)["dtype"]
    assert header.startswith("bfloat16 (auto: 1-token 20 ms vs 40 ms float32, 4-token 24 ms vs 48 ms, measured ")
    record = session.loaded.dtype.to_dict()
    assert record["dtype"] == "bfloat16" and record["text"] == header
    assert [t["dtype"] for t in record["timings"]] == ["float32", "bfloat16"]


def test_the_stats_panel_header_prints_the_targets_forward_plan_and_its_reasons(tiny_session):
    from localspec.ui.render import stats_html
    from localspec.ui.runtime import runtime_of

    plan = tiny_session.engine.target.plan
    runtime = runtime_of(tiny_session)
    panel = stats_html(None, runtime=runtime)
    assert runtime["plan"] == plan.summary() and f"plan {plan.summary()}" in panel
    for name, choice in (("lm_head", plan.lm_head), ("decode_attention", plan.decode_attention)):
        assert f"{name}: {choice.value} — {choice.reason}" in runtime["plan_reasons"]
    assert 'class="ls-runtime ls-plan" title="' in panel
