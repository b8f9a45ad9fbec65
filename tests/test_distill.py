"""`localspec distill` on the tiny pair: every kind trains end to end in a few updates, writes a loadable folder,
and runs as a proposer with greedy output identical to the target alone. Plus the data rules (held-out prompts)."""

from __future__ import annotations

import json

import pytest
import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.distill.batches import pick_draft_vocab, split_validation, windows
from localspec.distill.data import HELD_OUT_HUMANEVAL, HELD_OUT_MT_BENCH, held_out_prompts, training_prompts
from localspec.distill.run import DistillOptions, distill
from localspec.distill.train_head import chain_attention, shift
from localspec.engine.loop import Engine
from localspec.models.loading import share_target_embedding
from localspec.proposers import DraftModelProposer
from localspec.proposers.head import load_head_proposer
from tests.conftest import SHARED_DATA

PROMPTS = [
    "Hello there",
    "Write a poem",
    "What is 2+2?",
    "Tell me a story",
    "Explain gravity",
    "Name colors",
    "Count to five",
    "Say hi",
]
EVAL_PROMPT = [1, 72, 101, 108, 108, 111, 33, 10, 87]


def tiny_options(kind, out, **overrides):
    base = dict(
        kind=kind,
        out=out,
        answer_tokens=200,
        max_new_tokens=16,
        gen_batch_size=4,
        temperatures=(0.0,),
        draft_vocab=200,
        steps=3,
        batch_size=2,
        window=32,
        max_updates=4,
        eval_every=2,
        progress=False,
    )
    base.update(overrides)
    return DistillOptions(**base)


def greedy(target, proposer, spec_name, k=3, max_new=30):
    engine = Engine(target, {2})
    ids, stats = [], None
    for event in engine.generate(
        EVAL_PROMPT, SamplingParams(max_new_tokens=max_new), SpecConfig(proposer=spec_name, k=k), proposer
    ):
        ids.extend(t.token_id for t in event.tokens)
        stats = event.stats
    return ids, stats


@pytest.mark.parametrize(
    "kind", ["eagle", pytest.param("eagle3", marks=pytest.mark.slow), pytest.param("mtp", marks=pytest.mark.slow)]
)
def test_each_head_kind_distils_loads_and_is_lossless(tiny_pair, tiny_models, tmp_path, kind):
    from transformers import AutoTokenizer

    target, _ = tiny_models
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["target"])
    summary = distill(target, tokenizer, PROMPTS, tiny_options(kind, tmp_path / kind), log=lambda m: None)
    assert summary["kind"] == kind and summary["updates"] == 4 and summary["corpus_tokens"] >= 200
    config = json.loads((tmp_path / kind / "config.json").read_text())
    assert config["kind"] == kind and config["draft_vocab_size"] == 200
    assert config["num_modules"] == (3 if kind == "mtp" else 1)
    proposer = load_head_proposer(tmp_path / kind, target, "cpu")
    baseline, _ = greedy(target, None, "none")
    ids, stats = greedy(target, proposer, "head")
    assert ids == baseline and stats.drafted > 0


@pytest.mark.slow
def test_multi_layer_features_distil_fresh_and_widen_a_trained_head(tiny_pair, tiny_models, tmp_path):
    """--feature-layers: a fresh head reads [layer 0 ; last hidden] (teacher-forced once, cached next to the
    corpus); --init on a last-hidden head widens it ('auto' on a 2-layer target is layer 0)."""
    from transformers import AutoTokenizer

    from localspec.heads.io import load_head

    target, _ = tiny_models
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["target"])
    corpus = tmp_path / "corpus"
    fresh = distill(
        target,
        tokenizer,
        PROMPTS,
        tiny_options("eagle3", tmp_path / "fresh", feature_layers=(0,), corpus_dir=corpus),
        log=lambda m: None,
    )
    assert fresh["feature_layers"] == [0]
    assert json.loads((tmp_path / "fresh" / "config.json").read_text())["feature_layers"] == [0]
    cached = sorted(p.name for p in (corpus / "features-0").glob("shard-*.pt"))
    assert cached and cached == sorted(p.name for p in corpus.glob("shard-*.pt"))
    first = torch.load(corpus / "features-0" / cached[0])["features"][0]
    stale = torch.load(corpus / "features-0" / cached[-1])  # a cache from other ids is computed again
    torch.save({**stale, "key": [(1, 1)]}, corpus / "features-0" / cached[-1])
    from localspec.distill.corpus import load_corpus

    again = load_corpus(corpus, target, (0,))
    assert torch.load(corpus / "features-0" / cached[-1])["key"] == stale["key"]
    assert len(again) == fresh["corpus_sequences"] and all(f.shape[-1] == 128 for _, f in again)
    stored = torch.load(corpus / cached[0])["hidden"][0]
    assert first.shape[-1] == 2 * stored.shape[-1]
    torch.testing.assert_close(first[:, 64:].float(), stored.float(), atol=2e-2, rtol=2e-2)  # same last hidden
    baseline, _ = greedy(target, None, "none")
    ids, stats = greedy(target, load_head_proposer(tmp_path / "fresh", target, "cpu"), "head")
    assert ids == baseline and stats.drafted > 0

    distill(
        target, tokenizer, PROMPTS, tiny_options("eagle", tmp_path / "narrow", corpus_dir=corpus), log=lambda m: None
    )
    wide = distill(
        target,
        tokenizer,
        PROMPTS,
        tiny_options("eagle", tmp_path / "wide", corpus_dir=corpus, init=tmp_path / "narrow", feature_layers="auto"),
        log=lambda m: None,
    )
    assert wide["feature_layers"] == [0]
    narrow_head, wide_head = load_head(tmp_path / "narrow", target), load_head(tmp_path / "wide", target)
    assert narrow_head.feature_proj is None and wide_head.config.feature_layers == (0,)
    ids, stats = greedy(target, load_head_proposer(tmp_path / "wide", target, "cpu"), "head")
    assert ids == baseline and stats.drafted > 0
    again = distill(
        target,
        tokenizer,
        PROMPTS,
        tiny_options("eagle", tmp_path / "again", corpus_dir=corpus, init=tmp_path / "wide"),
        log=lambda m: None,
    )
    assert again["feature_layers"] == [0]  # the --init head's layers when none are named
    with pytest.raises(ConfigError, match="not retrained on"):
        distill(
            target,
            tokenizer,
            PROMPTS,
            tiny_options("eagle", tmp_path / "x", corpus_dir=corpus, init=tmp_path / "wide", feature_layers=(1,)),
            log=lambda m: None,
        )
    with pytest.raises(ConfigError, match="below the last layer"):
        distill(
            target,
            tokenizer,
            PROMPTS,
            tiny_options("eagle", tmp_path / "y", corpus_dir=corpus, feature_layers=(1,)),
            log=lambda m: None,
        )
    with pytest.raises(ConfigError, match="feature-layers"):
        tiny_options("draft", tmp_path / "d", feature_layers=(0,)).validate()


def test_standalone_draft_distils_to_a_transformers_folder(tiny_pair, tiny_models, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, _ = tiny_models
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["target"])
    summary = distill(target, tokenizer, PROMPTS, tiny_options("draft", tmp_path / "d"), log=lambda m: None)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["localspec_kind"] == "draft" and config["num_hidden_layers"] == 2
    assert config["localspec_embedding_from_target"] is True  # the target's embedding is not stored again
    from safetensors import safe_open

    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as stored:
        assert "model.embed_tokens.weight" not in stored.keys() and "model.layers.0.mlp.up_proj.weight" in stored.keys()
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "d").eval()
    embedding = target.get_input_embeddings().weight.numel()  # frozen and borrowed: not counted as trained
    total = sum(p.numel() for p in draft.parameters())
    assert summary["trainable_parameters"] == total - embedding * (1 if target.config.tie_word_embeddings else 2)
    share_target_embedding(draft, target)
    torch.testing.assert_close(draft.get_output_embeddings().weight, target.get_output_embeddings().weight)
    torch.testing.assert_close(draft.get_input_embeddings().weight, target.get_input_embeddings().weight)
    baseline, _ = greedy(target, None, "none")
    ids, stats = greedy(target, DraftModelProposer(draft), "draft")
    assert ids == baseline and stats.drafted > 0
    with pytest.raises(ConfigError, match="draft"):
        load_head_proposer(tmp_path / "d", target, "cpu")
    # named in models.yaml, the loader fills the embedding from the target
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    yaml_path = tmp_path / "models.yaml"
    yaml_path.write_text(
        f"- name: distilled\n  target: {{source: {tiny_pair['target']}, quant: none, dtype: float32}}\n"
        f"  proposers:\n    draft: {{source: {tmp_path / 'd'}, dtype: float32}}\n"
    )
    loaded = load_pair(load_registry(yaml_path)[0], device="cpu")
    torch.testing.assert_close(loaded.draft.get_input_embeddings().weight, loaded.target.get_input_embeddings().weight)
    torch.testing.assert_close(loaded.draft.get_output_embeddings().weight, target.get_output_embeddings().weight)


def test_resume_reuses_the_corpus_and_continues_training(tiny_pair, tiny_models, tmp_path):
    from transformers import AutoTokenizer

    target, _ = tiny_models
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["target"])
    first = distill(target, tokenizer, PROMPTS, tiny_options("eagle", tmp_path / "e"), log=lambda m: None)
    shards = sorted(p.name for p in (tmp_path / "e" / "corpus").glob("shard-*.pt"))
    second = distill(
        target,
        tokenizer,
        PROMPTS,
        tiny_options("eagle", tmp_path / "e", resume=True, max_updates=6),
        log=lambda m: None,
    )
    assert sorted(p.name for p in (tmp_path / "e" / "corpus").glob("shard-*.pt")) == shards
    assert second["corpus_tokens"] == first["corpus_tokens"]
    assert second["updates"] == 6 and [h["update"] for h in second["history"]][:2] == [2, 4]


def test_cli_distill_writes_a_head(tiny_pair, tmp_path):
    from localspec.cli.main import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "cli-head"
    code = main(
        [
            "distill",
            "--models",
            str(tiny_pair["models_yaml"]),
            "--kind",
            "eagle",
            "--out",
            str(out),
            "--data-dir",
            "none",
            "--prompts",
            str(prompts),
            "--tokens",
            "150",
            "--max-new-tokens",
            "12",
            "--draft-vocab",
            "150",
            "--max-updates",
            "2",
            "--eval-every",
            "1",
            "--steps",
            "2",
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert code == 0 and (out / "head.safetensors").exists()
    assert (
        main(
            [
                "distill",
                "--models",
                str(tiny_pair["models_yaml"]),
                "--kind",
                "eagle",
                "--out",
                str(out),
                "--data-dir",
                "none",
                "--prompts",
                str(prompts),
                "--device",
                "cpu",
            ]
        )
        == 2
    )  # exists, no --resume
    assert (
        main(
            [
                "distill",
                "--models",
                str(tiny_pair["models_yaml"]),
                "--kind",
                "eagle",
                "--out",
                str(tmp_path / "x"),
                "--data-dir",
                "none",
                "--prompts",
                str(tmp_path / "nope.txt"),
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "distill",
                "--models",
                str(tiny_pair["models_yaml"]),
                "--kind",
                "eagle",
                "--out",
                str(tmp_path / "y"),
                "--data-dir",
                "none",
                "--prompts",
                str(prompts),
                "--feature-layers",
                "low",
            ]
        )
        == 2
    )


def test_held_out_prompts_never_reach_training():
    if not (SHARED_DATA / "mt_bench_question.jsonl").exists():
        pytest.skip("shared data not present")
    held = held_out_prompts(SHARED_DATA)
    assert len(held) == len(HELD_OUT_MT_BENCH) + len(HELD_OUT_HUMANEVAL)
    train = set(training_prompts(SHARED_DATA, stdlib_limit=50))
    assert not train & set(held)
    assert any(isinstance(p, str) and p.startswith("Complete this Python function") for p in train)


def test_validation_split_keeps_whole_sequences_apart():
    seqs = [(torch.arange(10 + i), torch.zeros(9 + i, 4)) for i in range(40)]
    train, val = split_validation(seqs, 0.1, 0)
    assert len(val) == 4 and len(train) == 36
    assert not {len(s[0]) for s in train} & {len(s[0]) for s in val}
    # chat sequences: <start> prompt <start> answer. Two answers to one prompt never straddle the split
    chats = [(torch.tensor([1, 50 + q, 60, 1, 70 + a, 71]), torch.zeros(5, 4)) for q in range(10) for a in range(3)]
    train, val = split_validation(chats, 0.2, 0)
    assert len(val) == 6 and len(train) == 24
    assert not {int(s[0][1]) for s in train} & {int(s[0][1]) for s in val}
    for ids, hidden in windows(train, 8):
        assert len(ids) == hidden.shape[0] + 1 <= 9


def test_draft_vocab_keeps_stop_tokens_and_frequent_tokens():
    seqs = [(torch.tensor([300, 300, 300, 301, 7]), None)]
    vocab = pick_draft_vocab(seqs, 320, 8, always={2}, by_id_share=0.5)
    assert vocab.tolist() == sorted(vocab.tolist()) and len(vocab) == 8
    assert {2, 300, 301}.issubset(set(vocab.tolist()))


def test_training_time_test_mask_matches_inference_attention():
    """The chain query at step j sees real keys up to its chain's start plus the chain's own entries."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 6, 4)
    real_k, real_v = torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4)
    k2, v2 = torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4)
    out = chain_attention(q, real_k, real_v, 1, [(shift(k2, 0, dim=2), shift(v2, 0, dim=2))])
    i = 4  # step-2 query at index 4: real keys 0..3 and its own key
    keys = torch.cat([real_k[0, 0, :i], k2[0, 0, i : i + 1]])
    values = torch.cat([real_v[0, 0, :i], v2[0, 0, i : i + 1]])
    weights = torch.softmax(q[0, 0, i] @ keys.T / 2.0, dim=-1)
    torch.testing.assert_close(out[0, 0, i], weights @ values)


DOCS = [
    (f"Tell me about item {i}", f"Item {i} is a thing with {i * 7} parts and a colour of its own.") for i in range(12)
]


def test_teacher_forced_rows_match_an_unpadded_forward(tiny_models):
    from localspec.distill.stream import teacher_forced_pieces

    target, _ = tiny_models
    rows = [[1, 72, 101, 108, 108, 111], [1, 87, 111, 114, 108, 100, 33, 10, 65, 66]]
    pieces = teacher_forced_pieces(target, rows)
    for row, (ids, hidden) in zip(rows, pieces):
        with torch.inference_mode():
            alone = target.base_model(input_ids=torch.tensor([row])).last_hidden_state[0, :-1]
        assert ids.tolist() == row and hidden.shape == alone.shape
        torch.testing.assert_close(hidden, alone.float(), atol=1e-4, rtol=1e-4)


def test_batched_generation_matches_the_target_alone_and_its_features(tiny_models):
    """Left-padded batched generation (static cache): each row's greedy answer is the target's unbatched greedy
    answer, it stops at (and keeps) the stop token, and the stored hidden states equal a teacher-forced forward."""
    from localspec.distill.corpus import generate_batch

    target, _ = tiny_models
    prompts = [[1, 72, 101, 108, 108, 111], [1, 87, 111, 114, 108, 100, 33, 10, 65, 66], [1, 90]]
    stop = {2}
    results = generate_batch(target, prompts, max_new_tokens=12, stop_ids=stop, pad_id=0)
    assert len(results) == len(prompts)
    for prompt, (ids, hidden) in zip(prompts, results):
        alone = prompt[:]
        with torch.inference_mode():
            for _ in range(12):
                next_id = int(target(input_ids=torch.tensor([alone])).logits[0, -1].argmax())
                alone.append(next_id)
                if next_id in stop:
                    break
            features = target.base_model(input_ids=torch.tensor([alone])).last_hidden_state[0, :-1]
        assert ids.tolist() == alone
        assert hidden.shape == features.shape and hidden.dtype == torch.float16
        torch.testing.assert_close(hidden.float(), features, atol=2e-2, rtol=2e-2)


@pytest.mark.slow
def test_stream_text_trains_on_fresh_text_and_init_continues_a_head(tiny_pair, tiny_models, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from localspec.distill import stream

    target, _ = tiny_models
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["target"])
    seen = []
    real = stream.teacher_forced_pieces

    def counting(model, rows, *rest):
        seen.extend(tuple(r) for r in rows)
        return real(model, rows, *rest)

    with monkeypatch.context() as patch:
        patch.setattr(stream, "teacher_forced_pieces", counting)
        first = distill(
            target,
            tokenizer,
            [],
            tiny_options("eagle", tmp_path / "s", answer_tokens=0, stream_text=True),
            log=lambda m: None,
            documents=DOCS,
        )
    assert first["updates"] == 4 and first["corpus_tokens"] == 0
    assert len(set(seen)) >= 6  # several different documents went through the target, no corpus on disk
    assert len(seen) > len(set(seen))  # training passed over its documents more than once…
    held_out = {tuple(r) for r in seen[:8]}  # …but never over the 8 held back for validation (teacher-forced first)
    assert not held_out & {tuple(r) for r in seen[8:]}
    assert not list((tmp_path / "s").glob("corpus/shard-*.pt"))
    before = (tmp_path / "s" / "head.safetensors").read_bytes()
    second = distill(
        target,
        tokenizer,
        [],
        tiny_options("eagle", tmp_path / "s2", answer_tokens=0, stream_text=True, init=tmp_path / "s", lr=1e-2),
        log=lambda m: None,
        documents=DOCS,
    )
    assert second["updates"] == 4 and (tmp_path / "s2" / "head.safetensors").read_bytes() != before
    baseline, _ = greedy(target, None, "none")
    ids, _ = greedy(target, load_head_proposer(tmp_path / "s2", target, "cpu"), "head")
    assert ids == baseline
    with pytest.raises(ConfigError, match="init"):
        tiny_options("draft", tmp_path / "d", init=tmp_path / "s").validate()
    with pytest.raises(ConfigError, match="hard-label-weight"):
        tiny_options("eagle", tmp_path / "h", hard_label_weight=1.5).validate()
    with pytest.raises(ConfigError, match="hard-label-weight"):
        tiny_options("draft", tmp_path / "h", hard_label_weight=0.5).validate()


def test_a_head_distils_fresh_and_continues_on_a_bfloat16_target(tiny_pair, tmp_path):
    # the corpus's features are float32 batches; the head trains in float32 whatever the target computes in, and
    # its frozen copies of the target's embedding and LM head follow (they are not parameters)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(tiny_pair["target"], dtype=torch.bfloat16).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["target"])
    first = distill(target, tokenizer, PROMPTS, tiny_options("eagle", tmp_path / "a"), log=lambda m: None)
    second = distill(
        target,
        tokenizer,
        PROMPTS,
        tiny_options("eagle", tmp_path / "b", init=tmp_path / "a", corpus_dir=tmp_path / "a" / "corpus"),
        log=lambda m: None,
    )
    assert first["updates"] == second["updates"] == 4
    baseline, _ = greedy(target, None, "none")
    ids, stats = greedy(target, load_head_proposer(tmp_path / "b", target, "cpu"), "head")
    assert ids == baseline and stats.drafted > 0
