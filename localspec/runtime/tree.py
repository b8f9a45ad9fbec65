"""A token tree: the drafts of one step as several branches, verified by the target in one forward.

Node i holds token_ids[i]; its parent is parents[i] (an earlier node, or -1 for the root: the pending token, whose
logits score the first draft position). Nodes are in topological order, so a parent always comes before its
children. In the verify forward, row 0 is the pending token and row i + 1 is node i: every row sees the whole
cached prefix, itself and its ancestors, and sits at position prefix_len + its depth (the root's depth is 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

TREE_MAX_DEPTH = 8  # deepest node a proposer drafts (a continuation longer than this is cut)


@dataclass(frozen=True)
class TokenTree:
    token_ids: list[int]  # [N] the drafted token of each node
    parents: list[int]  # [N] the parent node of each node; -1 = the root (the pending token)
    depth: list[int] = field(init=False)  # [N] 1 for the root's children
    children: list[list[int]] = field(init=False)  # [N + 1] children of the root (index 0) and of node i (i + 1)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.parents):
            raise ValueError(f"a tree needs one parent per node ({len(self.token_ids)} ids, {len(self.parents)})")
        depth: list[int] = []
        children: list[list[int]] = [[] for _ in range(len(self.token_ids) + 1)]
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}'s parent {parent} is not an earlier node (or -1 for the root)")
            depth.append(1 if parent < 0 else depth[parent] + 1)
            children[parent + 1].append(i)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "children", children)

    @classmethod
    def chain(cls, token_ids: list[int]) -> TokenTree:
        """A tree of one branch: the chain proposal d1 → d2 → … as a tree."""
        return cls(list(token_ids), list(range(-1, len(token_ids) - 1)))

    @property
    def size(self) -> int:
        return len(self.token_ids)

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    def first_branch(self) -> list[int]:
        """The nodes reached from the root by always taking the first child (the proposer's first choice at each
        depth): the chain this tree grew from."""
        path, node = [], -1
        while self.children[node + 1]:
            node = self.children[node + 1][0]
            path.append(node)
        return path

    def ancestors(self, node: int) -> list[int]:
        """node's ancestors from the root's child down to node itself (the root-to-node path, node included)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def within_depth(self, max_depth: int) -> TokenTree:
        """The nodes at depth ≤ max_depth (an ancestor-closed subset: the indices are renumbered)."""
        kept = [i for i, d in enumerate(self.depth) if d <= max_depth]
        index = {old: new for new, old in enumerate(kept)}
        return TokenTree([self.token_ids[i] for i in kept], [index.get(self.parents[i], -1) for i in kept])


def make_dummy(n_nodes: int, branching: int = 2, first_token: int = 3) -> TokenTree:
    """A full tree of n_nodes in breadth-first order, each node with up to `branching` children; token ids count
    up from first_token (for tests and warm-up forwards)."""
    parents = [-1 if i < branching else (i - branching) // branching for i in range(n_nodes)]
    return TokenTree([first_token + i for i in range(n_nodes)], parents)


def tree_visible_rows(tree: TokenTree) -> tuple[tuple[int, ...], ...]:
    """Per row of a tree forward (row 0 the pending token, row i + 1 node i): the rows it sees, in row order."""
    rows = [(0,)]
    for node in range(tree.size):
        rows.append((0, *(a + 1 for a in tree.ancestors(node))))  # the path root → node (parents come first)
    return tuple(rows)


def tree_visibility(tree: TokenTree, device: torch.device | str = "cpu") -> torch.Tensor:
    """[N+1, N+1] bool: row r may attend to tree row c (itself, its ancestors, and the root row 0)."""
    visible = torch.zeros((tree.size + 1, tree.size + 1), dtype=torch.bool)
    for row, seen in enumerate(tree_visible_rows(tree)):
        visible[row, list(seen)] = True
    return visible.to(device)


def _as_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """visible [T, L] bool → [1, 1, T, L]: itself for dtype bool (True = visible, what sdpa takes), else additive:
    0 = visible, the dtype's lowest value = hidden (eager attention adds it to the scores)."""
    if dtype == torch.bool:
        return visible[None, None]
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def causal_mask(prefix_len: int, rows: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """[1, 1, rows, prefix_len + rows] mask of a chain on top of a cache of prefix_len positions: row i sees key j
    where j ≤ prefix_len + i (dtype bool or additive, as _as_mask)."""
    keys = torch.arange(prefix_len + rows, device=device)  # [P+T]
    return _as_mask(keys[None, :] <= (prefix_len + torch.arange(rows, device=device))[:, None], dtype)  # [T, P+T]


def tree_attention_mask(
    tree: TokenTree, prefix_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[1, 1, N+1, prefix_len+N+1] mask for a forward of the pending token and the N nodes on top of a cache of
    prefix_len positions: every row sees the whole prefix, itself and its ancestors. dtype bool: True = visible
    (what transformers builds for sdpa); a float dtype: additive, 0 = visible, the dtype's lowest value = hidden
    (eager attention adds it to the scores)."""
    n = tree.size
    visible = torch.cat(
        [torch.ones((n + 1, prefix_len), dtype=torch.bool, device=device), tree_visibility(tree, device)], dim=1
    )  # [N+1, prefix_len+N+1]
    return _as_mask(visible, dtype)


def tree_positions(tree: TokenTree, prefix_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, N+1] int64 position ids: prefix_len for the pending token, prefix_len + depth for each node."""
    return torch.tensor([[prefix_len] + [prefix_len + d for d in tree.depth]], dtype=torch.long, device=device)
