"""The whole distillation: corpus (the target's answers + optional teacher-forced offline text) → draft vocabulary
→ training with validation and early stopping → a folder models.yaml can name."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from localspec.config import ConfigError
from localspec.heads.config import HEAD_KINDS, HeadConfig, target_shapes
from localspec.heads.io import load_head, read_head_config, save_head
from localspec.heads.model import FeatureHead, with_feature_layers
from localspec.models.stop_tokens import stop_token_ids
from localspec.runtime.features import default_feature_layers

from .batches import pick_draft_vocab, split_validation, windows
from .corpus import build_corpus, build_text_corpus, load_corpus
from .train_head import expected_acceptance_length, train_head, ttt_forward

KINDS = HEAD_KINDS + ("draft",)


@dataclass(frozen=True)
class DistillOptions:
    kind: str
    out: Path
    answer_tokens: int = 200_000  # the target's own answers to the training prompts
    text_tokens: int = 0  # teacher-forced offline text (stdlib sources, package docs), stored in the corpus
    stream_text: bool = False  # teacher-force offline text inside the training loop instead (fresh every update)
    answer_share: float = 0.25  # with stream_text: share of batches drawn from the stored answers
    init: Optional[Path] = None  # start from this trained head folder (same kind) instead of the target's last layer
    # target layers read before the last hidden (EAGLE-3's multi-layer features); "auto" = low, middle, high.
    # With --init on a last-hidden-only head, the head is widened and starts where it was (features.py).
    feature_layers: tuple | str = ()
    draft_vocab: int = 8192  # 0 = the full vocabulary
    minutes: Optional[float] = None  # total budget; corpus building gets at most half
    resume: bool = False
    steps: int = 4  # draft steps trained with training-time test (and MTP modules)
    # heads: share of the loss on the target's argmax (what greedy acceptance checks); the rest on its distribution
    hard_label_weight: float = 0.0
    max_new_tokens: int = 256
    gen_batch_size: int = 32  # static KV cache; 64 at once: ~170 answer tokens/s on 2 threads here
    temperatures: tuple = (0.0, 0.7)
    batch_size: int = 8
    window: int = 256
    lr: float = 5e-4
    max_updates: int = 100_000
    eval_every: int = 200
    patience: int = 4
    val_fraction: float = 0.05
    draft_layers: int = 2
    seed: int = 0
    corpus_dir: Optional[Path] = None
    progress: bool = True

    def validate(self) -> DistillOptions:
        if self.kind not in KINDS:
            raise ConfigError(f"--kind must be one of {', '.join(KINDS)} (got {self.kind!r})")
        if (
            self.answer_tokens < 0
            or self.text_tokens < 0
            or (self.answer_tokens + self.text_tokens <= 0 and not self.stream_text)
        ):
            raise ConfigError("--tokens / --text-tokens / --stream-text must ask for some data")
        if not 0.0 <= self.answer_share <= 1.0:
            raise ConfigError("--answer-share must be from 0 to 1")
        if self.init is not None and self.kind == "draft":
            raise ConfigError("--init continues a trained head; it does not apply to --kind draft")
        if self.feature_layers and self.kind == "draft":
            raise ConfigError(
                "--feature-layers is for heads (eagle, eagle3, mtp); a standalone draft reads tokens only"
            )
        if self.feature_layers != "auto" and any(not isinstance(i, int) or i < 0 for i in self.feature_layers):
            raise ConfigError(f"--feature-layers takes layer indices or 'auto' (got {self.feature_layers!r})")
        if self.draft_vocab < 0:
            raise ConfigError("--draft-vocab must be 0 (full vocabulary) or a positive number")
        if self.minutes is not None and self.minutes <= 0:
            raise ConfigError("--minutes must be positive")
        if self.patience < 1:
            raise ConfigError("--patience must be at least 1")
        if self.gen_batch_size < 1 or self.batch_size < 1:
            raise ConfigError("--gen-batch-size and --batch-size must be at least 1")
        if not 1 <= self.steps <= 16:
            raise ConfigError("--steps must be from 1 to 16")
        if not 0.0 <= self.hard_label_weight <= 1.0:
            raise ConfigError("--hard-label-weight must be from 0 to 1")
        if self.hard_label_weight and self.kind == "draft":
            raise ConfigError("--hard-label-weight is for heads (eagle, eagle3, mtp)")
        return self


def trainable_parameters(model: torch.nn.Module) -> int:
    """What training updates: the frozen embedding / LM head borrowed from the target are not counted."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def resolve_feature_layers(options: DistillOptions, target: torch.nn.Module) -> tuple[int, ...]:
    """The layers the head will read: --feature-layers ('auto' = low, middle, high), else those of the --init head."""
    num_layers = target.config.num_hidden_layers
    init_layers = read_head_config(options.init).feature_layers if options.init is not None else ()
    if options.feature_layers == "auto":
        wanted = default_feature_layers(num_layers)
    else:
        wanted = tuple(sorted(set(options.feature_layers))) or init_layers
    if not set(init_layers) <= set(wanted):
        raise ConfigError(
            f"--init {options.init} reads layers {list(init_layers)}; it can be widened to more layers "
            f"but not retrained on {list(wanted)}"
        )
    if any(i >= num_layers - 1 for i in wanted):
        raise ConfigError(f"--feature-layers must be below the last layer ({num_layers - 1}); got {list(wanted)}")
    return wanted


def distill(
    target: torch.nn.Module,
    tokenizer,
    prompts: list[str],
    options: DistillOptions,
    log: Callable[[str], None] = print,
    documents: Optional[list] = None,
) -> dict:
    options.validate()
    torch.manual_seed(options.seed)
    t_start = time.time()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus_dir = Path(options.corpus_dir) if options.corpus_dir else out / "corpus"
    corpus_minutes = options.minutes / 2 if options.minutes else None
    stops = stop_token_ids(tokenizer)
    target.eval()

    def progress(done, total, tokens):
        log(f"corpus: {done}/{total} batches, {tokens} tokens, {time.time() - t_start:.0f} s")

    if options.answer_tokens:
        if not prompts:
            raise ConfigError("no training prompts (pass --prompts FILE, or keep ../shared/data next to the repo)")
        build_corpus(
            target,
            tokenizer,
            prompts,
            corpus_dir,
            options.answer_tokens,
            max_new_tokens=options.max_new_tokens,
            batch_size=options.gen_batch_size,
            temperatures=options.temperatures,
            stop_ids=stops,
            seed=options.seed,
            minutes=corpus_minutes,
            progress=progress,
        )
    if options.text_tokens:
        from .text import offline_documents

        left = None if corpus_minutes is None else max(0.1, corpus_minutes - (time.time() - t_start) / 60)
        docs = documents if documents is not None else offline_documents(options.seed)
        build_text_corpus(
            target,
            tokenizer,
            docs,
            corpus_dir,
            options.answer_tokens + options.text_tokens,
            minutes=left,
            progress=progress,
        )
    feature_layers = resolve_feature_layers(options, target)
    if feature_layers:
        log(f"features: target layers {list(feature_layers)} + the last hidden")
    sequences = load_corpus(corpus_dir, target, feature_layers, progress=log) if corpus_dir.exists() else []
    if not sequences and not options.stream_text:
        raise ConfigError(f"the corpus in {corpus_dir} is empty")
    corpus_tokens = sum(len(ids) for ids, _ in sequences)
    corpus_s = time.time() - t_start
    log(f"corpus: {len(sequences)} sequences, {corpus_tokens} tokens ({corpus_s:.0f} s)")

    train_seqs, val_seqs = split_validation(sequences, options.val_fraction, options.seed)
    train_pieces, val_pieces = windows(train_seqs, options.window), windows(val_seqs, options.window)
    batches = None
    if options.stream_text:
        from .stream import mixed_batches, teacher_forced_documents, text_batches
        from .text import offline_documents

        # pieces of about window tokens (~2.5 characters a token with the chat template around them), so the
        # window cut keeps whole pieces instead of dropping each piece's tail
        docs = documents if documents is not None else offline_documents(options.seed, chars=int(options.window * 2.5))
        if not docs:
            raise ConfigError("--stream-text found no offline text to teacher-force")
        if not val_pieces:  # no stored answers to validate on: hold back a few documents, kept out of training
            held = min(4 * options.batch_size, len(docs) // 2)
            val_pieces = teacher_forced_documents(
                target, tokenizer, docs[len(docs) - held :], options.batch_size, options.window, feature_layers
            )
            docs = docs[: len(docs) - held]
        fresh = text_batches(target, tokenizer, docs, options.batch_size, options.window, options.seed, feature_layers)
        batches = mixed_batches(fresh, train_pieces, options.answer_share, options.batch_size, options.seed)
    minutes_left = None if options.minutes is None else max(0.2, options.minutes - (time.time() - t_start) / 60)
    common = dict(
        steps=options.steps,
        out_dir=out,
        lr=options.lr,
        batch_size=options.batch_size,
        max_updates=options.max_updates,
        minutes=minutes_left,
        eval_every=options.eval_every,
        patience=options.patience,
        seed=options.seed,
        resume=options.resume,
        log=log,
        progress=options.progress,
        batches=batches,
    )
    if options.kind == "draft":
        from .train_draft import draft_forward, make_draft, save_draft

        model = make_draft(target, options.draft_layers)
        result = train_head(
            model,
            train_pieces,
            val_pieces,
            forward=draft_forward,
            save=lambda m: save_draft(m, tokenizer, out),
            **{**common, "steps": 1},
        )
        model_size = trainable_parameters(model)
    else:
        vocab = target.config.vocab_size
        draft_vocab = options.draft_vocab or vocab
        config = HeadConfig(
            kind=options.kind,
            num_modules=options.steps if options.kind == "mtp" else 1,
            draft_vocab_size=min(draft_vocab, vocab),
            max_k=options.steps,
            feature_layers=feature_layers,
            **target_shapes(target.config),
        )
        if options.init is not None:
            head = load_head(options.init, target)
            if head.config.kind != options.kind:
                raise ConfigError(f"--init {options.init} is a {head.config.kind} head, not {options.kind}")
            if head.config.feature_layers != feature_layers:  # widen to more layers (a superset: checked in resolve)
                head = with_feature_layers(head, feature_layers)
        else:
            head = FeatureHead(config, target.get_input_embeddings().weight)
            head.set_lm_weight(target.get_output_embeddings().weight)
            head.set_draft_vocab(pick_draft_vocab(train_seqs, vocab, config.draft_vocab_size, stops))
            last_layer = target.base_model.layers[-1]
            for module in head.layers:
                module.init_from_target_layer(last_layer)
            for norm in head.norms:
                norm.weight.data.copy_(target.base_model.norm.weight.data)
            head.init_feature_proj()
        head = head.float().train()  # trained in float32 (the batches' features are), whatever the target runs
        forward = functools.partial(ttt_forward, hard_weight=options.hard_label_weight)
        result = train_head(head, train_pieces, val_pieces, save=lambda h: save_head(h, out), forward=forward, **common)
        model_size = trainable_parameters(head)
    summary = {
        "kind": options.kind,
        "corpus_tokens": corpus_tokens,
        "corpus_sequences": len(sequences),
        "train_windows": len(train_pieces),
        "val_windows": len(val_pieces),
        "corpus_seconds": round(corpus_s, 1),
        "train_minutes": round(result["minutes"], 2),
        "updates": result["updates"],
        "stop_reason": result["stop_reason"],
        "best_val_loss": result["best_val_loss"],
        "trainable_parameters": model_size,
        "steps": options.steps,
        "hard_label_weight": options.hard_label_weight,
        "draft_vocab": options.draft_vocab,
        "feature_layers": list(feature_layers),
        "history": result["history"],
    }
    last = [h for h in result["history"] if h.get("val_agreement")]
    if last:
        best = min(last, key=lambda h: h["val_loss"])
        summary["val_agreement"] = best["val_agreement"]
        if options.kind != "draft":
            summary["val_expected_acceptance_length"] = expected_acceptance_length(best["val_agreement"])
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
