"""Teacher forcing inside the training loop: fresh offline text goes through the target as training needs it, so
every update sees new tokens at prefill speed and nothing is stored (EAGLE-1's recipe: a fixed corpus, the
target's features by teacher forcing). Stored windows (the target's own answers) can be mixed in at a set share."""
from __future__ import annotations

import random
from typing import Iterator, Optional

import torch

from .batches import Batch, iterate_batches, make_batch
from .text import chat_ids


@torch.inference_mode()
def teacher_forced_pieces(target: torch.nn.Module, token_rows: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One right-padded prefill over the rows (causal attention keeps the padding out of the real positions).
    Returns per row (ids [T] int32, hidden [T-1, H] float32): hidden[p] predicts ids[p + 1]."""
    device = next(target.parameters()).device
    longest = max(len(row) for row in token_rows)
    input_ids = torch.zeros((len(token_rows), longest), dtype=torch.long, device=device)
    for i, row in enumerate(token_rows):
        input_ids[i, : len(row)] = torch.tensor(row, device=device)
    hidden = target.base_model(input_ids=input_ids).last_hidden_state.float()  # [B, T, H]
    return [(torch.tensor(row, dtype=torch.int32), hidden[i, : len(row) - 1].clone())
            for i, row in enumerate(token_rows)]


def text_batches(target: torch.nn.Module, tokenizer, documents: list[tuple[str, str]], batch_size: int,
                 window: int, seed: int = 0, skip: int = 0) -> Iterator[Batch]:
    """Batches of fresh teacher-forced text: each (ask, answer) document in the chat template, cut to window + 1
    tokens, used once per pass over the documents (passes reshuffle). `skip` documents are passed over first
    (resume)."""
    rng = random.Random(seed)
    device = next(target.parameters()).device
    order = list(range(len(documents)))
    position = skip
    while True:
        if position >= len(order):
            rng.shuffle(order)
            position = 0
        rows: list[list[int]] = []
        while len(rows) < batch_size and position < len(order):
            ask, answer = documents[order[position]]
            position += 1
            ids = chat_ids(tokenizer, ask, answer)[: window + 1]
            if len(ids) >= 8:
                rows.append(ids)
        if rows:
            yield make_batch(teacher_forced_pieces(target, rows), device)


def mixed_batches(fresh: Iterator[Batch], stored_pieces: Optional[list], stored_share: float, batch_size: int,
                  seed: int = 0) -> Iterator[Batch]:
    """Each batch is stored windows with probability `stored_share`, otherwise the next fresh batch."""
    rng = random.Random(seed + 1)
    stored = iterate_batches(stored_pieces, batch_size, seed) if stored_pieces and stored_share > 0 else None
    while True:
        if stored is not None and rng.random() < stored_share:
            yield next(stored)
        else:
            yield next(fresh)
