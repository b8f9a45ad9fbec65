"""Check a speculative greedy answer against plain decoding under a path's Guarantee (see guarantee.py).

Only the first position where the two answers part can be judged (after it their contexts differ). There the top-2
gap is read from plain decoding's own logits, recomputed exactly as plain decoding makes them: the prompt minus its
last token prefilled, then one token per forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .guarantee import Guarantee


@dataclass(frozen=True)
class GreedyComparison:
    ok: bool  # identical, or parted where the guarantee allows it
    at: int | None  # the first position where they part; None when identical
    gap: float | None  # plain decoding's top-2 logit gap there
    detail: str


def first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@torch.inference_mode()
def plain_top2_gap(model: torch.nn.Module, prompt_ids: list[int], answer_ids: list[int], position: int) -> float:
    """Top-2 logit gap of plain decoding's prediction of answer token `position` (where one answer stopped and the
    other went on, too: the stop token was one of the two)."""
    from localspec.runtime.model_runner import ModelRunner

    runner = ModelRunner(model)
    runner.reset()
    runner.extend(prompt_ids[:-1], logits_to_keep=0)
    logits = None
    for token in [prompt_ids[-1]] + list(answer_ids[:position]):
        logits = runner.extend([token], logits_to_keep=1).logits[-1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def compare_greedy(
    model: torch.nn.Module,
    prompt_ids: list[int],
    plain_ids: list[int],
    spec_ids: list[int],
    guarantee: Guarantee,
    tree: bool = False,  # token trees: the guarantee's tree figures
) -> GreedyComparison:
    at = first_difference(plain_ids, spec_ids)
    bound = guarantee.tree_flip_bound if tree else guarantee.flip_bound
    if at is None:
        return GreedyComparison(True, None, None, f"{len(plain_ids)} tokens identical")
    gap = plain_top2_gap(model, prompt_ids, plain_ids, at)
    if guarantee.allows_flip(gap, tree):
        return GreedyComparison(
            True,
            at,
            gap,
            f"near-tie flip at token {at}: top-2 logit gap {gap:.2e} < the {guarantee.path} bound {bound:.2e}",
        )
    return GreedyComparison(
        False,
        at,
        gap,
        f"outputs differ at token {at} where the top-2 logit gap is {gap:.2e}, "
        f"not below the {guarantee.path} bound {bound:.2e}",
    )
