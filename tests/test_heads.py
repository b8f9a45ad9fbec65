"""Feature-level heads (EAGLE / Eagle3 / MTP) as proposers: lossless greedy output, the Eagle3 first-step
duplication, the MTP one-module-per-step rule, the KV-cache rollback, and clear errors on bad folders."""

from __future__ import annotations

import pytest
import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.heads.config import HeadConfig, target_shapes
from localspec.heads.io import load_head, save_head
from localspec.proposers.base import DraftNoise, Proposer
from localspec.proposers.head import HeadProposer, load_head_proposer
from localspec.runtime.model_runner import ModelRunner
from tests.support import DRAFT_VOCAB, HELLO_PROMPT, make_head

PROMPT = HELLO_PROMPT


def run_engine(target, proposer, k: int = 3, temperature: float = 0.0, max_new: int = 40, prompt=PROMPT):
    engine = Engine(target, {2})
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new, seed=3)
    spec = SpecConfig(proposer="none" if proposer is None else "head", k=k)
    ids, last = [], None
    for event in engine.generate(list(prompt), sampling, spec, proposer):
        ids.extend(t.token_id for t in event.tokens)
        last = event
    return ids, last.stats


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "kind,modules,layers",
    [
        ("eagle", 1, ()),
        pytest.param("eagle3", 1, (), marks=SLOW),
        pytest.param("mtp", 3, (), marks=SLOW),
        pytest.param("eagle", 1, (0,), marks=SLOW),
        pytest.param("eagle3", 1, (0,), marks=SLOW),
        pytest.param("mtp", 2, (0,), marks=SLOW),
    ],
)
def test_head_proposer_greedy_is_lossless(tiny_models, tmp_path, kind, modules, layers):
    target, _ = tiny_models
    save_head(make_head(target, kind, modules, feature_layers=layers), tmp_path / kind)
    proposer = load_head_proposer(tmp_path / kind, target, "cpu")
    assert isinstance(proposer, Proposer) and proposer.wants_hidden
    assert proposer.feature_layers == layers and proposer.head.config.feature_layers == layers
    baseline, _ = run_engine(target, None)
    for k in (1, 3, 5):
        ids, stats = run_engine(target, proposer, k=k)
        assert ids == baseline
        assert stats.drafted > 0  # the head really drafted


def test_draft_probabilities_are_distributions_over_the_draft_vocab(tiny_models):
    target, _ = tiny_models
    head = make_head(target, "eagle")
    proposer = HeadProposer(head)
    runner = ModelRunner(target)
    runner.reset()
    hidden = runner.extend(PROMPT[:-1], want_hidden=True).hidden
    proposer.begin(PROMPT, hidden)
    sampling = SamplingParams(temperature=0.8, top_p=0.9)
    draft = proposer.propose(PROMPT, 4, sampling, DraftNoise(torch.Generator().manual_seed(0)))
    assert len(draft.token_ids) == 4 and draft.probs.shape == (4, target.config.vocab_size)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(4))
    outside = torch.ones(target.config.vocab_size, dtype=torch.bool)
    outside[head.draft_token_ids] = False
    assert float(draft.probs[:, outside].abs().max()) == 0.0
    assert all(bool(~outside[t]) for t in draft.token_ids)


def test_sampled_decoding_with_a_head_runs(tiny_models):
    target, _ = tiny_models
    ids, stats = run_engine(target, HeadProposer(make_head(target, "eagle3")), temperature=1.0)
    assert len(ids) > 0 and stats.drafted > 0


def test_eagle3_first_step_duplicates_the_target_hidden(tiny_models):
    target, _ = tiny_models
    head = make_head(target, "eagle3")
    inputs = []
    head.layers[0].fc_proj.register_forward_hook(lambda mod, args, out: inputs.append(args[0].detach().clone()))
    proposer = HeadProposer(head)
    runner = ModelRunner(target)
    runner.reset()
    hidden = runner.extend(PROMPT[:-1], want_hidden=True).hidden  # [T-1, H]
    proposer.begin(PROMPT, hidden)
    proposer.propose(PROMPT, 3, SamplingParams(), torch.Generator())
    size = target.config.hidden_size
    first = inputs[0][0]  # the catch-up over the prompt: [T-1, 2H]
    torch.testing.assert_close(first[:, :size], first[:, size:])  # [target hidden ; target hidden]
    torch.testing.assert_close(first[:, size:], hidden)
    for later in inputs[1:]:  # draft steps 2..K: [last target hidden ; the head's own hidden]
        torch.testing.assert_close(later[0, 0, :size], hidden[-1])
        assert not torch.allclose(later[0, 0, size:], hidden[-1])


def test_mtp_uses_module_i_at_draft_step_i(tiny_models):
    target, _ = tiny_models
    head = make_head(target, "mtp", modules=3)
    assert [head.config.module_for_step(s) for s in (1, 2, 3, 4)] == [0, 1, 2, 2]
    calls = []
    for index, module in enumerate(head.layers):
        module.q_proj.register_forward_hook(lambda mod, args, out, i=index: calls.append((i, args[0].shape[1])))
    proposer = HeadProposer(head)
    runner = ModelRunner(target)
    runner.reset()
    proposer.begin(PROMPT, runner.extend(PROMPT[:-1], want_hidden=True).hidden)
    proposer.propose(PROMPT, 3, SamplingParams(), torch.Generator())
    catch_up = [c for c in calls if c[1] == len(PROMPT) - 1]
    chain = [c[0] for c in calls if c[1] == 1]
    assert sorted(i for i, _ in catch_up) == [0, 1, 2]  # every module keeps its cache of real positions
    assert chain == [1, 2]  # step 2 → module 1, step 3 → module 2 (step 1 is module 0's catch-up output)


@pytest.mark.parametrize("kind,modules", [("eagle", 1), ("mtp", 2)])
def test_rollback_leaves_the_cache_of_a_fresh_run(tiny_models, kind, modules):
    target, _ = tiny_models
    head = make_head(target, kind, modules)
    proposer = HeadProposer(head)
    ids, stats = run_engine(target, proposer, k=4, max_new=30)
    assert stats.drafted > stats.accepted  # rejections happened
    fed = proposer.fed
    context = PROMPT + ids
    assert 0 < fed < len(context)
    fresh = HeadProposer(head)
    runner = ModelRunner(target)
    runner.reset()
    hidden = runner.extend(context[:fed], want_hidden=True).hidden  # h_0 .. h_(fed-1)
    fresh.begin(context[: fed + 1], hidden)
    assert fresh.catch_up(context[: fed + 1])
    for used, clean in zip(proposer.caches, fresh.caches):
        assert used.length == clean.length == fed
        torch.testing.assert_close(used.keys[:, :, :fed], clean.keys[:, :, :fed], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(used.values[:, :, :fed], clean.values[:, :, :fed], atol=1e-4, rtol=1e-4)


def test_one_token_prompt_starts_without_a_draft(tiny_models):
    target, _ = tiny_models
    baseline, _ = run_engine(target, None, prompt=[1], max_new=12)
    ids, _ = run_engine(target, HeadProposer(make_head(target, "eagle")), prompt=[1], max_new=12)
    assert ids == baseline


def test_bad_head_folders_give_clear_errors(tiny_models, tmp_path):
    target, _ = tiny_models
    with pytest.raises(ConfigError, match="config.json"):
        load_head_proposer(tmp_path / "missing", target, "cpu")
    with pytest.raises(ConfigError, match="no head folder"):
        load_head_proposer(None, target, "cpu")
    head = make_head(target, "eagle")
    save_head(head, tmp_path / "ok")
    config = (tmp_path / "ok" / "config.json").read_text().replace('"hidden_size": 64', '"hidden_size": 96')
    (tmp_path / "ok" / "config.json").write_text(config)
    with pytest.raises(ConfigError, match="hidden size"):
        load_head(tmp_path / "ok", target)
    (tmp_path / "ok" / "config.json").write_text('{"kind": "medusa", "hidden_size": 64, "vocab_size": 320}')
    with pytest.raises(ConfigError):
        load_head(tmp_path / "ok", target)


def assert_greedy_lossless_on_shared_prompts(session, proposer: str, k: int = 4) -> None:
    """Greedy speculative output with `proposer` equals the no-proposer output on a few shared prompts, within the
    target path's guarantee (the embedded target's dtype is measured per machine: float32 or bfloat16)."""
    from tests.conftest import shared_prompts
    from tests.lossless import assert_within_guarantee

    sampling = SamplingParams(temperature=0.0, max_new_tokens=48)
    drafted = 0
    for n, prompt in enumerate(shared_prompts(limit_mt=2, limit_code=1)):
        ids, _ = session.prompt_ids([{"role": "user", "content": prompt}], 48)
        base = [
            t.token_id
            for e in session.engine.generate(ids, sampling, SpecConfig(proposer="none", k=k))
            for t in e.tokens
        ]
        spec_ids, stats = [], None
        for event in session.engine.generate(
            ids,
            sampling,
            SpecConfig(proposer=proposer, k=k),
            session.make_proposer(session.default_spec(proposer=proposer)),
        ):
            spec_ids.extend(t.token_id for t in event.tokens)
            stats = event.stats
        assert_within_guarantee(session, ids, base, spec_ids, f"prompt {n} {proposer} K={k}")
        drafted += stats.drafted
    assert drafted > 0


@pytest.mark.slow
def test_shipped_head_matches_the_embedded_target_and_is_lossless(embedded_session):
    """The head under assets/drafts/ that models.yaml names for the default pair."""
    session = embedded_session
    folder = session.loaded.spec.head
    if folder is None:
        pytest.skip("the default models.yaml entry names no head")
    target = session.loaded.target
    head = load_head(folder, target)
    assert head.config.hidden_size == target.config.hidden_size
    assert head.config.vocab_size == target.get_input_embeddings().weight.shape[0] == len(session.tokenizer)
    assert int(head.draft_token_ids.max()) < head.config.vocab_size
    assert all(0 <= i < target.config.num_hidden_layers - 1 for i in head.config.feature_layers)
    assert_greedy_lossless_on_shared_prompts(session, "head")
    assert_greedy_lossless_on_shared_prompts(session, "ngram+head")


@pytest.mark.slow
def test_shipped_draft_matches_the_embedded_target_and_is_lossless(embedded_session):
    """The standalone draft under assets/drafts/: stored without the embedding, which comes from the target."""
    session = embedded_session
    if session.loaded.spec.draft is None:
        pytest.skip("the default models.yaml entry names no standalone draft")
    draft, target = session.loaded.draft, session.loaded.target
    assert draft is not None and draft.config.localspec_kind == "draft"
    assert draft.config.num_hidden_layers < target.config.num_hidden_layers
    for ours, theirs in (
        (draft.get_input_embeddings().weight, target.get_input_embeddings().weight),
        (draft.get_output_embeddings().weight, target.get_output_embeddings().weight),
    ):  # the draft runs in its own dtype (float32); the target in the one measured fastest here
        torch.testing.assert_close(ours.to(theirs.dtype), theirs, atol=0, rtol=0)
    assert_greedy_lossless_on_shared_prompts(session, "draft")


@pytest.mark.parametrize(
    "kind,modules,layers",
    [("eagle", 1, ()), ("eagle3", 1, ()), ("mtp", 3, ()), ("eagle", 1, (0,)), ("eagle3", 1, (0,))],
)
def test_training_forward_equals_inference_drafting(tiny_models, kind, modules, layers):
    """ttt_forward's step-j prediction at a position is what the proposer computes at draft step j there (with
    multi-layer features: the training batch holds teacher-forced features, inference reads them from the cache)."""
    from localspec.distill.batches import make_batch
    from localspec.distill.stream import teacher_forced_pieces
    from localspec.distill.train_head import ttt_forward

    target, _ = tiny_models
    head = make_head(target, kind, modules, seed=1, feature_layers=layers)
    proposer = HeadProposer(head)
    runner = ModelRunner(target)
    runner.reset()
    prompt = PROMPT
    proposer.begin(prompt, runner.extend(prompt[:-2], want_hidden=True, feature_layers=layers).hidden)
    proposer.on_verified(0, [prompt[-1]], runner.extend(prompt[-2:-1], want_hidden=True, feature_layers=layers).hidden)
    logits_seen = []
    original = head.draft_logits
    head.draft_logits = lambda hidden: logits_seen.append(original(hidden)) or logits_seen[-1]
    draft = proposer.propose(prompt, 3, SamplingParams(), torch.Generator())
    head.draft_logits = original
    ids = prompt + draft.token_ids  # the chain's tokens as if they were real
    (piece,) = teacher_forced_pieces(target, [ids], layers)  # (ids, features [T-1, F])
    assert piece[1].shape[-1] == head.config.feature_size
    batch = make_batch([piece])
    th_logits = []
    with torch.no_grad():
        ttt_forward(head, batch, 3, collect_logits=th_logits)
    n = len(prompt) - 1  # draft step j predicts at position n + j - 1 → index n + j - 2
    for step in range(3):
        torch.testing.assert_close(th_logits[step][0, n + step - 1], logits_seen[step], atol=1e-4, rtol=1e-4)


def test_hard_label_weight_mixes_soft_and_argmax_cross_entropy(tiny_models):
    """hard_weight 1 trains cross-entropy to the target's argmax over the draft vocabulary, 0 the soft target,
    and values between mix the two linearly."""
    from localspec.distill.batches import make_batch
    from localspec.distill.stream import teacher_forced_pieces
    from localspec.distill.train_head import ttt_forward

    target, _ = tiny_models
    head = make_head(target, "eagle", seed=2)
    batch = make_batch(teacher_forced_pieces(target, [PROMPT + [33, 10, 87, 101]], ()))
    seen = []
    with torch.no_grad():
        losses = {
            w: float(ttt_forward(head, batch, 1, reg_weight=0.0, hard_weight=w, collect_logits=seen)[0])
            for w in (0.0, 0.5, 1.0)
        }
    logits = seen[-1][0]  # [S, Vd] the head's step-1 logits (the same with every weight)
    teacher = (batch.target_hidden[0] @ head.draft_lm_weight.T).argmax(-1)  # [S]
    expected = torch.nn.functional.cross_entropy(logits[batch.valid[0]], teacher[batch.valid[0]])
    assert losses[1.0] == pytest.approx(float(expected), rel=1e-5)
    assert losses[0.0] != pytest.approx(losses[1.0], rel=1e-3)
    assert losses[0.5] == pytest.approx((losses[0.0] + losses[1.0]) / 2, rel=1e-5)


def test_teacher_forced_top_k_lines_up_with_what_the_proposer_drafts(tiny_models):
    """The evaluation's top-k shares: an answer built so that every other token is the head's own first draft from
    that prefix (and the others are not) gives step-1 top-1 exactly that share; more k never finds fewer; top-|Vd|
    finds every answer token in the draft vocabulary."""
    from localspec.distill.evaluate import teacher_forced_top_k

    target, _ = tiny_models
    head = make_head(target, "eagle", seed=3)
    runner = ModelRunner(target)

    def first_draft(prefix):
        runner.reset()
        proposer = HeadProposer(head)
        proposer.begin(prefix, runner.extend(prefix[:-1], want_hidden=True).hidden)
        return proposer.propose(prefix, 1, SamplingParams(), torch.Generator()).token_ids[0]

    ids, drafted = list(PROMPT), []
    for t in range(10):
        draft = first_draft(ids)
        ids.append(draft if t % 2 == 0 else (draft + 1) % 256)
        drafted.append(t % 2 == 0)
    answer = ids[len(PROMPT) :]
    shares = teacher_forced_top_k(head, target, [(ids, len(PROMPT))], steps=2, ks=(1, 2, DRAFT_VOCAB))
    assert shares[0][0] == pytest.approx(sum(drafted) / len(answer))
    for row in shares:
        assert 0.0 <= row[0] <= row[1] <= row[2] <= 1.0
    vocab = set(head.draft_token_ids.tolist())
    assert shares[0][2] == pytest.approx(sum(token in vocab for token in answer) / len(answer))


def test_multi_layer_features_come_from_the_named_layers(tiny_models):
    """The runner's features are [layer outputs ; last hidden], the same with a KV cache, one step at a time, as
    in one teacher-forced prefill."""
    from localspec.distill.stream import teacher_forced_pieces
    from localspec.runtime.features import backbone_features

    target, _ = tiny_models
    size = target.config.hidden_size
    runner = ModelRunner(target)
    runner.reset()
    stepwise = torch.cat(
        [runner.extend(PROMPT[:4], want_hidden=True, feature_layers=(0,)).hidden]
        + [runner.extend([t], want_hidden=True, feature_layers=(0,)).hidden for t in PROMPT[4:]]
    )
    assert stepwise.shape == (len(PROMPT), 2 * size)
    with torch.no_grad():
        layer0 = target.model.layers[0]
        captured = []
        hook = layer0.register_forward_hook(
            lambda mod, args, out: captured.append(out[0] if isinstance(out, tuple) else out)
        )
        try:
            out, features = backbone_features(target.model, (0,), input_ids=torch.tensor([PROMPT]))
        finally:
            hook.remove()
    torch.testing.assert_close(features[0, :, :size], captured[0].reshape(len(PROMPT), size))
    torch.testing.assert_close(features[0, :, size:], out.last_hidden_state[0])
    torch.testing.assert_close(stepwise, features[0], atol=1e-4, rtol=1e-4)
    ((_, forced),) = teacher_forced_pieces(target, [PROMPT], (0,))
    torch.testing.assert_close(forced, features[0, :-1], atol=1e-4, rtol=1e-4)
    assert runner.extend([5], want_hidden=True).hidden.shape == (1, size)  # no layers named: the last hidden


def test_widening_a_head_keeps_its_drafts_until_the_new_layers_are_trained(tiny_models, tmp_path):
    from localspec.heads.model import with_feature_layers

    target, _ = tiny_models
    head = make_head(target, "eagle", seed=2)
    widened = with_feature_layers(head, (0,))
    assert widened.config.feature_layers == (0,) and widened.feature_proj.weight.shape == (64, 128)
    assert torch.equal(widened.draft_token_ids, head.draft_token_ids)
    narrow, narrow_stats = run_engine(target, HeadProposer(head), k=3)
    wide_ids, wide_stats = run_engine(target, HeadProposer(widened), k=3)
    assert wide_ids == narrow and (wide_stats.drafted, wide_stats.accepted) == (
        narrow_stats.drafted,
        narrow_stats.accepted,
    )
    save_head(widened, tmp_path / "wide")
    assert load_head(tmp_path / "wide", target).config.feature_layers == (0,)
    with torch.no_grad():  # now let layer 0 count: the drafts change (the earlier layer is really read)
        widened.feature_proj.weight[:, :64].normal_(0.0, 0.5)
    proposer = HeadProposer(widened)
    runner = ModelRunner(target)
    runner.reset()
    proposer.begin(PROMPT, runner.extend(PROMPT[:-1], want_hidden=True, feature_layers=(0,)).hidden)
    changed = proposer.propose(PROMPT, 4, SamplingParams(), torch.Generator())
    reference = HeadProposer(head)
    runner.reset()
    reference.begin(PROMPT, runner.extend(PROMPT[:-1], want_hidden=True).hidden)
    assert changed.token_ids != reference.propose(PROMPT, 4, SamplingParams(), torch.Generator()).token_ids


@pytest.mark.slow
def test_widening_a_multi_layer_head_keeps_its_trained_columns(tiny_models):
    """Widening (1,) to (0, 1): layer 1's trained projection columns and norm move to their new place, layer 0's
    start at zero, so the drafts are unchanged; a set that drops a layer the head reads is refused."""
    from localspec.heads.model import with_feature_layers

    target, _ = tiny_models
    head = make_head(target, "eagle", seed=3, feature_layers=(1,))
    with torch.no_grad():
        head.feature_norms[0].weight.mul_(1.5)  # a trained-looking norm, which must move with its columns
    widened = with_feature_layers(head, (0, 1))
    assert widened.feature_proj.weight.shape == (64, 3 * 64)
    assert torch.equal(widened.feature_proj.weight[:, :64], torch.zeros(64, 64))
    assert torch.equal(widened.feature_proj.weight[:, 64:], head.feature_proj.weight)
    assert torch.equal(widened.feature_norms[1].weight, head.feature_norms[0].weight)
    narrow, narrow_stats = run_engine(target, HeadProposer(head), k=3)
    wide, wide_stats = run_engine(target, HeadProposer(widened), k=3)
    assert wide == narrow and (wide_stats.drafted, wide_stats.accepted) == (narrow_stats.drafted, narrow_stats.accepted)
    with pytest.raises(ValueError, match="superset"):
        with_feature_layers(widened, (1,))


def test_bad_feature_layers_give_clear_errors(tiny_models, tmp_path):
    target, _ = tiny_models
    for layers in ([1, 0], [-1], [0, 0]):
        with pytest.raises(ConfigError, match="feature_layers"):
            HeadConfig(
                kind="eagle", draft_vocab_size=10, feature_layers=tuple(layers), **target_shapes(target.config)
            ).validate()
    save_head(make_head(target, "eagle", feature_layers=(0,)), tmp_path / "h")
    config = (tmp_path / "h" / "config.json").read_text()
    (tmp_path / "h" / "config.json").write_text(
        config.replace('"feature_layers": [\n    0\n  ]', '"feature_layers": [\n    5\n  ]')
    )
    with pytest.raises(ConfigError, match="this target has 2 layers"):
        load_head(tmp_path / "h", target)
    (tmp_path / "h" / "config.json").write_text(
        config.replace('"feature_layers": [\n    0\n  ]', '"feature_layers": 0')
    )
    with pytest.raises(ConfigError, match="list of layer indices"):
        load_head(tmp_path / "h", target)
