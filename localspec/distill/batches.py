"""Corpus sequences → padded training windows. A window of N + 1 ids and N feature rows gives S = N - 1 query
positions p = 1..N-1 (index i = p - 1): token x_p, previous features h_(p-1), target features h_p. A feature row is
the target's last hidden state (F = H), or the outputs of some earlier layers followed by it (see features.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [B, S] int64, x_p
    prev_hidden: torch.Tensor  # [B, S, F] float32, features h_(p-1)
    target_hidden: torch.Tensor  # [B, S, F] float32, features h_p (the last H columns: the last hidden state)
    valid: torch.Tensor  # [B, S] bool, False on padding


def windows(sequences: list[tuple[torch.Tensor, torch.Tensor]], window: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut (ids [T], hidden [T-1, H]) into pieces of at most `window` hidden rows (and one more id)."""
    out = []
    for ids, hidden in sequences:
        for start in range(0, hidden.shape[0], window):
            piece_hidden = hidden[start : start + window]
            if piece_hidden.shape[0] >= 3:
                out.append((ids[start : start + piece_hidden.shape[0] + 1], piece_hidden))
    return out


def make_batch(pieces: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device | str = "cpu") -> Batch:
    longest = max(h.shape[0] for _, h in pieces) - 1
    size = pieces[0][1].shape[1]
    tokens = torch.zeros((len(pieces), longest), dtype=torch.long)
    prev_hidden = torch.zeros((len(pieces), longest, size))
    target_hidden = torch.zeros((len(pieces), longest, size))
    valid = torch.zeros((len(pieces), longest), dtype=torch.bool)
    for row, (ids, hidden) in enumerate(pieces):
        s = hidden.shape[0] - 1
        tokens[row, :s] = ids[1 : s + 1].long()
        prev_hidden[row, :s] = hidden[:s].float()
        target_hidden[row, :s] = hidden[1 : s + 1].float()
        valid[row, :s] = True
    return Batch(tokens.to(device), prev_hidden.to(device), target_hidden.to(device), valid.to(device))


def iterate_batches(pieces: list, batch_size: int, seed: int, device="cpu"):
    """Shuffled batches (similar lengths together, less padding), forever."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(pieces)))
        rng.shuffle(order)
        groups = [order[i : i + batch_size * 16] for i in range(0, len(order), batch_size * 16)]
        batches = []
        for group in groups:
            group.sort(key=lambda i: pieces[i][1].shape[0])
            batches.extend(group[i : i + batch_size] for i in range(0, len(group), batch_size))
        rng.shuffle(batches)
        for batch in batches:
            yield make_batch([pieces[i] for i in batch], device)


def prompt_key(ids: torch.Tensor) -> tuple:
    """What a sequence was asked: its ids up to the last occurrence of its first id (in a chat template the
    turn-start token, so the key ends before the assistant's answer). A sequence whose first id never recurs is
    its own key."""
    ids_list = ids.tolist()
    last = max((i for i, t in enumerate(ids_list) if t == ids_list[0]), default=0) if ids_list else 0
    return tuple(ids_list[:last]) if last > 0 else tuple(ids_list)


def split_validation(sequences: list, fraction: float, seed: int) -> tuple[list, list]:
    """Whole prompts go to one side: every answer to a prompt (greedy and sampled) lands with the others, so the
    validation agreement measures new questions, not a second answer to a question seen in training."""
    groups: dict[tuple, list[int]] = {}
    for index, (ids, _hidden) in enumerate(sequences):
        groups.setdefault(prompt_key(ids), []).append(index)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    wanted = max(1, int(len(sequences) * fraction)) if len(sequences) > 1 and len(keys) > 1 else 0
    val_index: set[int] = set()
    for key in keys:
        if len(val_index) >= wanted:
            break
        val_index.update(groups[key])
    val = [sequences[i] for i in sorted(val_index)]
    train = [sequences[i] for i in range(len(sequences)) if i not in val_index]
    return train, val


def token_counts(sequences: list, vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, _ in sequences:
        counts += torch.bincount(ids.long(), minlength=vocab_size)[:vocab_size]
    return counts


def pick_draft_vocab(
    sequences: list, vocab_size: int, draft_vocab: int, always: set[int] = frozenset(), by_id_share: float = 0.5
) -> torch.Tensor:
    """The draft vocabulary, sorted by id: `always` (e.g. the stop tokens), then the most frequent tokens of the
    corpus for (1 - by_id_share) of it, then the lowest ids not yet chosen (a byte-level BPE numbers its tokens in
    merge order, roughly by frequency in the tokenizer's own training text), so a corpus narrower than the chats
    the head will see (code, say) does not decide the whole vocabulary."""
    draft_vocab = min(draft_vocab, vocab_size)
    counts = token_counts(sequences, vocab_size).float()
    chosen = torch.zeros(vocab_size, dtype=torch.bool)
    for token in always:
        if 0 <= token < vocab_size:
            chosen[token] = True
    by_count = max(0, int(round(draft_vocab * (1 - by_id_share))) - int(chosen.sum()))
    ranked = torch.argsort(counts, descending=True, stable=True)
    ranked = ranked[counts[ranked] > 0]
    chosen[ranked[:by_count]] = True
    missing = draft_vocab - int(chosen.sum())
    if missing > 0:
        free = torch.nonzero(~chosen)[:, 0]
        chosen[free[:missing]] = True
    return torch.nonzero(chosen)[:, 0]
