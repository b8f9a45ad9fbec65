"""The exact forward setup (engine/model_runner.py exact_setup) on the tiny pair: every row of a 2..17-row forward
is bitwise the row plain decoding computes alone, and the checks fail without the remedy; exact: auto decides from
timings at load and caches the decision; models.yaml / CLI set it."""

from __future__ import annotations

import pytest
import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.models import exact_choice
from localspec.models.registry import parse_registry
from localspec.proposers import NgramProposer
from localspec.runtime.model_runner import FAST, ForwardSetup, ModelRunner, causal_mask, exact_setup
from localspec.runtime.tree import TokenTree

PREFIX = 40
NEW = 20


@pytest.fixture(scope="module")
def tiny_by_dtype(tiny_pair):
    from transformers import AutoModelForCausalLM

    return {
        name: AutoModelForCausalLM.from_pretrained(tiny_pair["target"], dtype=dtype).eval()
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))
    }


def _ids(model) -> list[int]:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, model.config.vocab_size, (PREFIX + NEW,), generator=generator).tolist()


def unequal_rows(model, setup: ForwardSetup) -> int:
    """Positions among NEW whose logits from R-row forwards (R = 2..17) are not bitwise the 1-row forward's."""
    ids, runner = _ids(model), ModelRunner(model, compile="off", setup=setup)
    runner.reset()
    runner.extend(ids[:PREFIX], logits_to_keep=0)
    plain = torch.cat([runner.extend([t]).logits for t in ids[PREFIX:]])  # [NEW, V]
    unequal = 0
    for rows in range(2, 18):
        runner.crop(PREFIX)
        chunks = [runner.extend(ids[PREFIX + i : PREFIX + i + rows]).logits for i in range(0, NEW, rows)]
        unequal += int((torch.cat(chunks) != plain).any(-1).sum())
    return unequal


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_exact_setup_rows_are_bitwise_the_plain_rows(tiny_by_dtype, dtype):
    model = tiny_by_dtype[dtype]
    assert unequal_rows(model, exact_setup(model.dtype)) == 0


@pytest.mark.parametrize(
    "dtype,setup",
    [
        ("bfloat16", FAST),
        ("float32", FAST),
        ("float32", ForwardSetup(attention="eager", explicit_mask=True, min_rows=4)),  # float32 needs multiples of 4
    ],
)
def test_without_the_remedy_the_same_check_fails(tiny_by_dtype, dtype, setup):
    """The check above can fail: off the exact setup, rows inside multi-row forwards round differently here."""
    assert unequal_rows(tiny_by_dtype[dtype], setup) > 0


def test_a_chain_tree_gives_the_plain_rows_and_dummy_rows_leave_no_trace(tiny_by_dtype):
    model = tiny_by_dtype["float32"]
    ids, runner = _ids(model), ModelRunner(model, compile="off", setup=exact_setup(model.dtype))
    runner.reset()
    runner.extend(ids[:PREFIX], logits_to_keep=0)
    plain = torch.cat([runner.extend([t]).logits for t in ids[PREFIX : PREFIX + 3]])  # [3, V]
    assert runner.tokens == ids[: PREFIX + 3] and runner.cache.get_seq_length() == PREFIX + 3  # dummies dropped
    runner.crop(PREFIX)
    tree = TokenTree.chain(ids[PREFIX + 1 : PREFIX + 2])  # 2 rows: padded to 8 with dummy leaves
    forward = runner.extend_tree(ids[PREFIX], tree)
    assert forward.logits.shape[0] == 2 and torch.equal(forward.logits, plain[:2])
    runner.keep_path(PREFIX, [0, 1])
    assert runner.cache.get_seq_length() == PREFIX + 2
    assert torch.equal(runner.extend([ids[PREFIX + 2]]).logits[0], plain[2])  # the cache rows it left are plain's


def test_causal_mask_hides_the_future_only():
    mask = causal_mask(2, 3, torch.float32, "cpu")[0, 0]  # [3, 5]
    visible = mask == 0
    assert visible.tolist() == [[True, True, True, False, False], [True] * 4 + [False], [True] * 5]


def test_speculative_greedy_equals_plain_in_bfloat16(tiny_by_dtype):
    """Engine with exact forwards: the n-gram chains' greedy tokens are plain decoding's, for every K."""
    model = tiny_by_dtype["bfloat16"]
    engine = Engine(model, exact=True)
    prompt = _ids(model)[:30] * 2  # repeats: the n-gram lookup drafts
    sampling = SamplingParams(max_new_tokens=24)

    def tokens(spec, proposer):
        return [t.token_id for e in engine.generate(prompt, sampling, spec, proposer) for t in e.tokens]

    plain = tokens(SpecConfig(proposer="none"), None)
    for k in (1, 3, 8):
        assert tokens(SpecConfig(proposer="ngram", k=k), NgramProposer(1, 4)) == plain, k


class FakeTimer:
    def __init__(self, exact_ratio: float) -> None:
        self.exact_ratio = exact_ratio
        self.calls = 0

    def __call__(self, models, sizes, setups):
        self.calls += 1
        assert setups["fast"] == FAST and setups["exact"].padded(1) > 1
        return {name: {s: 0.01 * (self.exact_ratio if name == "exact" else 1.0) for s in sizes} for name in models}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("ratio,on", [(1.1, True), (1.4, False)])
def test_auto_turns_exact_on_when_cheap_and_caches_the_decision(tiny_by_dtype, home, ratio, on):
    model, timer = tiny_by_dtype["float32"], FakeTimer(ratio)
    first = exact_choice.choose_exact("auto", model, "src", "folder", 4, torch.device("cpu"), timer)
    assert (first.on, first.how, timer.calls) == (on, "measured", 1)
    assert f"{ratio:.2f}×" in first.describe()
    second = exact_choice.choose_exact("auto", model, "src", "folder", 4, torch.device("cpu"), timer)
    assert (second.on, second.how, timer.calls) == (on, "cached", 1)  # nothing timed again


def test_an_explicit_setting_times_nothing(tiny_by_dtype, home):
    timer = FakeTimer(3.0)
    for setting, on in (("on", True), ("off", False)):
        decision = exact_choice.choose_exact(setting, tiny_by_dtype["float32"], "s", "f", 4, torch.device("cpu"), timer)
        assert (decision.on, decision.how) == (on, "entry")
    assert timer.calls == 0


def test_auto_on_the_row_invariant_kernels_takes_the_plans_answer_and_times_and_writes_nothing(home, tmp_path):
    """A model whose every decoder linear is on a row-invariant block kernel (exact-kernels): the exact setup is on
    with the plan's reason, nothing is timed (a timer that would turn it off is never called) or cached."""
    from localspec.models.gguf_model import build_from_file
    from localspec.runtime.library import LibraryLoad
    from localspec.runtime.plan import plan_forward

    from .conftest import library_or_skip
    from .gguf_files import write_gguf

    library = library_or_skip()
    path = write_gguf(tmp_path / "tiny.gguf", linear_type="Q8_0")
    folder = str(path)  # a GGUF target's config and tokenizer are its header's
    model = build_from_file(path, folder, torch.bfloat16, LibraryLoad(library, "test"))
    if plan_forward(model, exact=True).setup_id != "exact-kernels":
        pytest.skip("the attention kernel does not run here")
    timer, said = FakeTimer(3.0), []
    decision = exact_choice.choose_exact("auto", model, str(path), folder, 4, torch.device("cpu"), timer, said.append)
    assert (decision.on, decision.how, timer.calls, said) == (True, "plan", 0, [])
    assert "every linear on row-invariant kernels, no timing needed" in decision.describe()
    assert decision.to_dict()["how"] == "plan"
    assert not (home / "cache" / exact_choice.CACHE_FILE).exists()


def test_auto_says_before_it_times(tiny_by_dtype, home):
    said = []
    exact_choice.choose_exact(
        "auto", tiny_by_dtype["float32"], "s", "f", 4, torch.device("cpu"), FakeTimer(1.0), said.append
    )
    assert said == ["Timing the exact forward setup against the fast one (once per machine)…"]
    exact_choice.choose_exact(
        "auto", tiny_by_dtype["float32"], "s", "f", 4, torch.device("cpu"), FakeTimer(1.0), said.append
    )
    assert len(said) == 1  # the cached decision times nothing, so says nothing


def test_models_yaml_exact_field(tiny_pair):
    def entry(value: str):
        text = f"- name: tiny\n  target: {{source: {tiny_pair['target']}}}\n  exact: {value}\n"
        return parse_registry(text, tiny_pair["root"])[0]

    assert entry("true").exact == "on" and entry("false").exact == "off" and entry("auto").exact == "auto"
    with pytest.raises(ConfigError, match="'exact' must be true, false or auto"):
        entry("sometimes")


def test_the_lossless_check_of_an_identical_path_fails_on_one_differing_token(tiny_by_dtype, monkeypatch):
    """tests/lossless.py on a path stated bitwise identical (bfloat16, exact, where it was measured so: the AMD
    EPYC): == with no bound, so an answer that parts at one token (what one flipped rounding gives) fails, even at
    a near-tie."""
    from types import SimpleNamespace

    from localspec.verify import guarantee
    from tests.lossless import assert_within_guarantee

    monkeypatch.setattr(guarantee, "cpu_family", lambda: "amd-epyc")

    loaded = SimpleNamespace(target=tiny_by_dtype["bfloat16"], quant="none", device=torch.device("cpu"), exact_on=True)
    session = SimpleNamespace(loaded=loaded)
    assert_within_guarantee(session, [1, 2, 3], [4, 5, 6], [4, 5, 6], "equal")
    with pytest.raises(AssertionError, match="bitwise identical"):
        assert_within_guarantee(session, [1, 2, 3], [4, 5, 6], [4, 7, 6], "one token off")
