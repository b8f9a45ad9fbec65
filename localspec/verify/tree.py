"""Verifying a token tree: walk from the root, keep the longest accepted root-to-node path, emit one token more.

Words, as in the chain sampler (reference.py):
- accepted: a child of the current row that the target keeps; the walk moves to it.
- recovered: at a row none of whose children is kept, the target's own token (greedy: its argmax; sampling: a
  draw from the residual), and the walk stops.
- bonus: at a leaf that was reached, the target's token for the next position, and the walk stops.

Greedy: at the current row take the target's argmax; a child holding it is accepted, else the argmax is recovered.
At most one child can match (siblings hold different tokens).

Sampling (one-hot drafts, exact in distribution): at each row the target draws its own token with that output
position's noise (tree_position_draws: row 0 is output position `start`, a node at depth d is position start + d),
t = argmax(p / E), p the target's probabilities there (logits_to_probs, the chain's temperature / top-k / top-p); a
child holding t is accepted, else t is recovered. A child c is accepted with probability p(c), and the children
c1, c2, … of a row together with p(c1) + p(c2) + … (the SpecInfer / SpecTr multi-draft test gives the same), every
token comes out with probability p(token) exactly, and the emitted tokens are those plain seeded sampling draws at
the same output positions: a seeded answer is the same with or without the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from localspec.config import SamplingParams
from localspec.runtime.sampling import all_finite, argmax_last, logits_to_probs, position_draw, sample_with_noise
from localspec.runtime.tree import TokenTree


@dataclass(frozen=True)
class TreeDraws:
    """Random draws for one tree verification, made from the engine's seeded generator."""

    uniforms: torch.Tensor  # [N] float32 in [0, 1): the acceptance test of node i
    noise: torch.Tensor  # [N+1, V] float32 ~ Exp(1): the recovered / bonus draw at row r


def tree_position_draws(seed: int, start: int, tree: TokenTree, vocab: int, device: torch.device | str) -> TreeDraws:
    """A tree step's draws keyed to output positions: row 0 is position `start`, node i (row i + 1) position start +
    depth(i); node i's uniform is that of its own position start + depth(i) - 1 (the row its test is made at)."""
    depth = max(tree.depth, default=0)
    draws = [position_draw(seed, start + d, vocab, device) for d in range(depth + 1)]
    rows = [0] + tree.depth  # [N+1] the depth of each row
    uniforms = torch.stack([draws[d - 1][0] for d in tree.depth]) if tree.size else torch.zeros(0, device=device)
    return TreeDraws(uniforms=uniforms, noise=torch.stack([draws[d][1] for d in rows]))


def verify_tree_at(
    logits: torch.Tensor,
    tree: TokenTree,
    sampling: SamplingParams,
    start: int,
    finite: Optional[torch.Tensor] = None,  # [] bool: whether the forward's logits were finite (default: these)
) -> TreeVerdict:
    """verify_tree with the draws of output positions start, start + 1, … (row 0 is position `start`)."""
    draws = (
        None if sampling.greedy else tree_position_draws(sampling.seed, start, tree, logits.shape[-1], logits.device)
    )
    return verify_tree(logits, tree, sampling, draws, finite)


def make_tree_draws(generator: torch.Generator, n_nodes: int, vocab: int, device: torch.device | str) -> TreeDraws:
    uniforms = torch.rand((n_nodes,), generator=generator, device=device, dtype=torch.float32)
    noise = torch.empty((n_nodes + 1, vocab), device=device, dtype=torch.float32).exponential_(generator=generator)
    return TreeDraws(uniforms=uniforms, noise=noise)


@dataclass(frozen=True)
class TreeVerdict:
    """What the target decided about one tree, on the host."""

    path: list[int]  # the accepted nodes, root to deepest (num_accepted of them)
    emitted: list[int]  # the accepted nodes' tokens, then the recovered / bonus token
    branches: list[int]  # per accepted node: its index among its siblings (0 = the proposer's first choice)
    target_probs: list[float]  # per emitted token: p_target at its row
    rejected: Optional[tuple[int, float]]  # (first child's token, its p_target) when the last token was recovered
    finite: bool  # the logits held no NaN / inf

    @property
    def num_accepted(self) -> int:
        return len(self.path)

    @property
    def rows(self) -> list[int]:
        """The forward rows to keep in the cache: the pending token's row 0, then the path's rows."""
        return [0] + [node + 1 for node in self.path]


def verify_tree(
    logits: torch.Tensor,  # [N+1, V] row 0 = the pending token, row i + 1 = node i
    tree: TokenTree,
    sampling: SamplingParams,
    draws: Optional[TreeDraws],  # None only in greedy mode
    finite: Optional[torch.Tensor] = None,  # [] bool: whether the forward's logits were finite (default: these)
) -> TreeVerdict:
    n = tree.size
    device = logits.device
    probs = logits_to_probs(logits, sampling)  # [N+1, V]
    node_tokens = torch.tensor(tree.token_ids, dtype=torch.long, device=device)  # [N]
    parent_rows = torch.tensor([p + 1 for p in tree.parents], dtype=torch.long, device=device)  # [N]
    node_probs = probs[parent_rows, node_tokens] if n else probs.new_zeros(0)  # [N] p_target(node | parent row)
    if sampling.greedy:
        row_tokens = argmax_last(logits.float())  # [N+1] recovered / bonus token of each row
    else:
        if draws is None:
            raise ValueError("stochastic tree verification needs random draws")
        row_tokens = sample_with_noise(probs, draws.noise)  # [N+1] the target's own draw at each row
    row_token_probs = probs.gather(-1, row_tokens[:, None]).squeeze(-1)  # [N+1]
    finite = (all_finite(logits) if finite is None else finite).to(torch.float64).view(1)
    packed = torch.cat(
        [row_tokens.to(torch.float64), row_token_probs.to(torch.float64), node_probs.to(torch.float64), finite]
    ).tolist()  # the one host read
    tokens, token_probs = [int(t) for t in packed[: n + 1]], packed[n + 1 : 2 * n + 2]
    p_node, is_finite = packed[2 * n + 2 : 3 * n + 2], packed[-1] == 1.0

    path, emitted, branches, emitted_probs = [], [], [], []
    row = 0
    while True:
        chosen = None
        for branch, child in enumerate(tree.children[row]):
            if tree.token_ids[child] == tokens[row]:  # the target's own token (greedy: argmax; sampled: its draw)
                chosen = (branch, child)
                break
        if chosen is None:
            children = tree.children[row]
            rejected = (tree.token_ids[children[0]], p_node[children[0]]) if children else None
            emitted.append(tokens[row])
            emitted_probs.append(token_probs[row])
            return TreeVerdict(path, emitted, branches, emitted_probs, rejected, is_finite)
        branch, child = chosen
        path.append(child)
        emitted.append(tree.token_ids[child])
        branches.append(branch)
        emitted_probs.append(p_node[child])
        row = child + 1
