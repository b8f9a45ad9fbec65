"""Teacher forcing inside the training loop: fresh offline text goes through the target as training needs it, so
every update sees new tokens at prefill speed and nothing is stored (EAGLE-1's recipe: a fixed corpus, the
target's features by teacher forcing). Stored windows (the target's own answers) can be mixed in at a set share."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Optional

import torch

from localspec.runtime.features import backbone_features

from .batches import Batch, iterate_batches, make_batch
from .text import chat_ids


@torch.inference_mode()
def teacher_forced_pieces(
    target: torch.nn.Module, token_rows: list[list[int]], feature_layers: tuple[int, ...] = ()
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One right-padded prefill over the rows (causal attention keeps the padding out of the real positions).
    Returns per row (ids [T] int32, features [T-1, F] float32): features[p] predicts ids[p + 1] (F = H, the last
    hidden state, unless feature_layers names earlier layers too; see features.py)."""
    device = next(target.parameters()).device
    longest = max(len(row) for row in token_rows)
    input_ids = torch.zeros((len(token_rows), longest), dtype=torch.long, device=device)
    for i, row in enumerate(token_rows):
        input_ids[i, : len(row)] = torch.tensor(row, device=device)
    _, hidden = backbone_features(target.base_model, feature_layers, input_ids=input_ids)
    hidden = hidden.float()  # [B, T, F]
    return [
        (torch.tensor(row, dtype=torch.int32), hidden[i, : len(row) - 1].clone()) for i, row in enumerate(token_rows)
    ]


def document_ids(tokenizer, document: tuple[str, str], window: int) -> Optional[list[int]]:
    """An (ask, answer) document in the chat template, cut to window + 1 tokens; None when too short to train on."""
    ids = chat_ids(tokenizer, *document)[: window + 1]
    return ids if len(ids) >= 8 else None


def teacher_forced_documents(
    target: torch.nn.Module,
    tokenizer,
    documents: list[tuple[str, str]],
    batch_size: int,
    window: int,
    feature_layers: tuple[int, ...] = (),
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every document once, as (ids, hidden) pieces (e.g. a validation set held back from the text stream)."""
    rows = [ids for ids in (document_ids(tokenizer, doc, window) for doc in documents) if ids is not None]
    return [
        piece
        for start in range(0, len(rows), batch_size)
        for piece in teacher_forced_pieces(target, rows[start : start + batch_size], feature_layers)
    ]


def text_batches(
    target: torch.nn.Module,
    tokenizer,
    documents: list[tuple[str, str]],
    batch_size: int,
    window: int,
    seed: int = 0,
    feature_layers: tuple[int, ...] = (),
) -> Iterator[Batch]:
    """Batches of fresh teacher-forced text, forever: each document used once per pass (passes reshuffle)."""
    rng = random.Random(seed)
    device = next(target.parameters()).device
    order = list(range(len(documents)))
    position = 0
    while True:
        if position >= len(order):
            rng.shuffle(order)
            position = 0
        rows: list[list[int]] = []
        while len(rows) < batch_size and position < len(order):
            ids = document_ids(tokenizer, documents[order[position]], window)
            position += 1
            if ids is not None:
                rows.append(ids)
        if rows:
            yield make_batch(teacher_forced_pieces(target, rows, feature_layers), device)


def mixed_batches(
    fresh: Iterator[Batch], stored_pieces: Optional[list], stored_share: float, batch_size: int, seed: int = 0
) -> Iterator[Batch]:
    """Each batch is stored windows with probability `stored_share`, otherwise the next fresh batch."""
    rng = random.Random(seed + 1)
    stored = iterate_batches(stored_pieces, batch_size, seed) if stored_pieces and stored_share > 0 else None
    while True:
        if stored is not None and rng.random() < stored_share:
            yield next(stored)
        else:
            yield next(fresh)
