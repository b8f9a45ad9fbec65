"""The 'head' proposer: a trained feature-level head (EAGLE / Eagle3 / MTP) drafting from the target's hidden states.

The head keeps one KV cache per module holding real positions only (target hidden + real token). Each proposal
first feeds the positions verified since the last one, then drafts K steps, feeding its own predicted hidden state
back; the draft-chain entries are cropped right after (the rollback), so rejected drafts never stay in the cache.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Optional

import torch

from localspec.config import SamplingParams
from localspec.heads.io import load_head
from localspec.heads.model import FeatureHead
from localspec.runtime.sampling import logits_to_probs, top_logprobs
from localspec.runtime.tree import TREE_MAX_DEPTH, TokenTree

from .base import Draft, DraftNoise, Proposer

TREE_WIDTH = 4  # nodes expanded per depth: the most probable there, by cumulative draft probability
TREE_BRANCH = 4  # children drafted per expanded node: its most probable tokens


class HeadProposer(Proposer):
    name = "head"
    wants_hidden = True
    supports_tree = True

    def __init__(self, head: FeatureHead) -> None:
        self.head = head
        self.config = head.config
        self.vocab_size = head.lm_weight.shape[0]
        self.device = head.draft_token_ids.device
        self.dtype = next(head.parameters()).dtype
        self.feature_layers = tuple(head.config.feature_layers)  # the engine asks the target for these
        self.feature_size = head.config.feature_size
        self.begin([], None)

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        self.caches = self.head.new_caches()
        self.fed = 0  # real positions 1..fed are in every module's cache
        # target features at positions fed .. n-1, [t, F] each, as the target gave them: converted and projected
        # when the head next drafts (catch_up), all in one call, so a step the controller runs plain costs nothing
        self.pending: list[torch.Tensor] = []
        self._add_pending(prompt_hidden)
        self.last_hidden = None  # [H] the step-1 module's output at position fed
        self.anchor = None  # [H] target hidden at position fed - 1

    def _add_pending(self, features: Optional[torch.Tensor]) -> None:
        if features is not None:
            self.pending.append(features.detach().reshape(-1, self.config.feature_size))

    @torch.inference_mode()
    def catch_up(self, context_ids: list[int]) -> bool:
        """Feed the verified positions fed+1..n (n = len(context_ids) - 1) into every module. False when the head
        cannot draft here (no target hidden yet, or the context does not match what it was told)."""
        n = len(context_ids) - 1
        new = sum(rows.shape[0] for rows in self.pending)
        if n - self.fed != new:
            return False
        if new == 0:
            return self.last_hidden is not None
        features = torch.cat(self.pending).to(device=self.device, dtype=self.dtype)  # [new, F]
        hidden = self.head.project_features(features)  # [new, H] the rows the modules read
        tokens = torch.tensor(context_ids[self.fed + 1 : n + 1], dtype=torch.long, device=self.device)
        positions = torch.arange(self.fed + 1, n + 1, device=self.device)
        first_module = self.config.module_for_step(1)
        for index, cache in enumerate(self.caches):
            out = self.head.run_module(index, cache, hidden, tokens, positions, hidden)
            if index == first_module:
                self.last_hidden = out[-1]
        self.anchor = hidden[-1]
        self.fed = n
        self.pending = []
        return True

    @torch.inference_mode()
    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, noise: DraftNoise) -> Draft:
        if k <= 0 or not self.catch_up(context_ids):
            return Draft(token_ids=[])
        head, n = self.head, self.fed
        hidden = self.last_hidden
        token_ids: list[int] = []
        probs_rows: list[torch.Tensor] = []
        for step in range(1, k + 1):
            full_logits = torch.full((self.vocab_size,), float("-inf"), dtype=torch.float32, device=self.device)
            full_logits[head.draft_token_ids] = head.draft_logits(hidden).float()  # outside the draft vocab: p = 0
            probs = logits_to_probs(full_logits, sampling)  # [V]
            token = int(torch.argmax(full_logits) if sampling.greedy else noise.sample(step - 1, probs))
            token_ids.append(token)
            probs_rows.append(probs)
            if step < k:
                module = self.config.module_for_step(step + 1)
                hidden = head.run_module(
                    module,
                    self.caches[module],
                    hidden[None],
                    torch.tensor([token], dtype=torch.long, device=self.device),
                    torch.tensor([n + step], device=self.device),
                    self.anchor[None],
                )[-1]
        for cache in self.caches:
            cache.crop(n)  # drop the draft chain: the cache holds verified positions only
        return Draft(token_ids=token_ids, probs=torch.stack(probs_rows))

    def _tree_top(self, hidden: torch.Tensor, sampling: SamplingParams, n: int) -> tuple[list, list]:
        """[T, H] head hiddens → the n most probable next tokens of each row under the chain's distribution
        (log-probabilities [T][n], descending, and token ids [T][n]). Tokens outside the draft vocabulary have p = 0,
        so the distribution is computed over the draft vocabulary alone and its ids mapped back."""
        values, slots = top_logprobs(
            self.head.draft_logits(hidden), sampling, min(n, self.head.draft_token_ids.numel())
        )
        return values.tolist(), self.head.draft_token_ids[slots].tolist()

    @torch.inference_mode()
    def propose_tree(
        self, context_ids: list[int], n_nodes: int, sampling: SamplingParams, noise: DraftNoise
    ) -> Optional[TokenTree]:
        """EAGLE-2's dynamic tree: at each depth expand the TREE_WIDTH most probable nodes (by cumulative draft
        log-probability) by their TREE_BRANCH most probable tokens, all of a depth's nodes in one head call under a
        tree mask; then keep the n_nodes most probable candidates overall (a child is never more probable than its
        parent, so the kept set holds every kept node's ancestors). The tree is a function of the context only
        (top tokens, no draws): the verifier treats its nodes as one-hot drafts."""
        if n_nodes <= 0 or not self.catch_up(context_ids):
            return None
        n, branch = self.fed, min(TREE_BRANCH, n_nodes)
        tokens: list[int] = []  # per candidate: its token
        parents: list[int] = []  # its parent candidate (-1 = the root)
        depths: list[int] = []
        scores: list[float] = []  # cumulative log-probability
        producers: list[torch.Tensor] = []  # [H] the hidden whose logits drafted it (its parent's)
        rows: list[list[int]] = [[] for _ in self.caches]  # per module: the candidate of each draft row in its cache

        def add_children(parent_ids: list[int], hiddens: torch.Tensor, depth: int) -> None:
            top_values, top_ids = self._tree_top(hiddens, sampling, branch)  # [T][branch] each
            for parent, hidden, values, ids in zip(parent_ids, hiddens, top_values, top_ids):
                base = scores[parent] if parent >= 0 else 0.0
                for value, token in zip(values, ids):
                    if value == float("-inf"):
                        break
                    tokens.append(token)
                    parents.append(parent)
                    depths.append(depth)
                    scores.append(base + value)
                    producers.append(hidden)

        add_children([-1], self.last_hidden[None], 1)
        for depth in range(1, min(n_nodes, TREE_MAX_DEPTH)):
            ranked = sorted(scores, reverse=True)
            cutoff = ranked[n_nodes - 1] if len(ranked) >= n_nodes else float("-inf")  # children cannot enter below
            frontier = sorted((i for i, d in enumerate(depths) if d == depth), key=lambda i: -scores[i])
            frontier = [i for i in frontier[:TREE_WIDTH] if scores[i] > cutoff]
            if not frontier:
                break
            expanded = self._expand_tree(frontier, tokens, parents, depths, producers, rows, depth, n)
            add_children(frontier, expanded, depth + 1)
        for cache in self.caches:
            cache.crop(n)  # drop the draft rows: the cache holds verified positions only
        kept = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i))[:n_nodes]
        kept.sort(key=lambda i: (depths[i], i))  # parents before children
        index = {old: new for new, old in enumerate(kept)}
        return TokenTree([tokens[i] for i in kept], [index[parents[i]] if parents[i] >= 0 else -1 for i in kept])

    def _expand_tree(
        self,
        frontier: list[int],
        tokens: list[int],
        parents: list[int],
        depths: list[int],
        producers: list[torch.Tensor],
        rows: list[list[int]],
        depth: int,
        n: int,
    ) -> torch.Tensor:
        """Run the frontier nodes (all at `depth`) through the module of draft step depth + 1 in one call: each row
        sees the verified positions, the draft rows of its ancestors in that module's cache, and itself. Returns
        their hiddens [T, H], whose logits draft their children."""
        module = self.config.module_for_step(depth + 1)
        cache, module_rows = self.caches[module], rows[module]
        if self.head.on_kernel(module):  # the module's expanded nodes and the frontier again, after the verified rows
            called = module_rows + frontier
            lines = [lineage(node, parents) for node in called]  # each row sees its own line of the tree
            visible = torch.tensor([[other in line for other in called] for line in lines])
            module_rows.extend(frontier)
            cache.crop(n)
            return self.head.run_rows(
                module,
                cache,
                torch.stack([producers[i] for i in called]),  # [T, H]
                torch.tensor([tokens[i] for i in called], dtype=torch.long, device=self.device),  # [T]
                torch.tensor([n + depths[i] for i in called], device=self.device),  # [T]
                visible=visible.to(self.device),
            )[len(called) - len(frontier) :]
        visible = torch.zeros((len(frontier), n + len(module_rows) + len(frontier)), dtype=torch.bool)
        visible[:, :n] = True
        for j, node in enumerate(frontier):
            ancestors = lineage(node, parents)
            for r, owner in enumerate(module_rows):
                visible[j, n + r] = owner in ancestors
            visible[j, n + len(module_rows) + j] = True
        module_rows.extend(frontier)
        count = len(frontier)
        return self.head.run_module(
            module,
            cache,
            torch.stack([producers[i] for i in frontier]),  # [T, H]
            torch.tensor([tokens[i] for i in frontier], dtype=torch.long, device=self.device),  # [T]
            torch.full((count,), n + depth, device=self.device),  # [T]
            self.anchor[None].expand(count, -1),  # [T, H]
            visible.to(self.device),
        )

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        self._add_pending(target_hidden)


def lineage(node: int, parents: list[int]) -> set[int]:
    """A tree node and its ancestors (parents[i]: i's parent, -1 for the root's children)."""
    found = set()
    while node >= 0:
        found.add(node)
        node = parents[node]
    return found


# target model → {(folder, mtime, device): head}; keyed weakly, so a switched-away target (and its heads) is freed
_HEADS: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[str, float, str], FeatureHead]] = (
    weakref.WeakKeyDictionary()
)


def cached_head(folder, target_model: torch.nn.Module, device=None) -> FeatureHead:
    """The head in `folder` built on `target_model`, loaded once per folder (and its config's mtime) and target."""
    from localspec.config import ConfigError

    if folder is None:
        raise ConfigError("this model pair names no head folder (models.yaml: proposers: head: <folder>)")
    path = Path(folder)
    config_path = path / "config.json"
    if not config_path.exists():
        raise ConfigError(f"head folder {path} has no config.json (train one with `localspec distill`)")
    device = str(device) if device is not None else str(next(target_model.parameters()).device)
    key = (str(path.resolve()), config_path.stat().st_mtime, device)
    heads = _HEADS.setdefault(target_model, {})
    if key not in heads:
        heads[key] = on_kernels_where_they_run(load_head(path, target_model, device))
    return heads[key]


def on_kernels_where_they_run(head: FeatureHead) -> FeatureHead:
    """The head's inference on the kernels' library where it loads here with its layer kernel (as the target's
    layers: the same LOCALSPEC_Q4_KERNEL / LOCALSPEC_LAYER_KERNEL switches), else on the torch ops."""
    if head.draft_token_ids.device.type != "cpu":
        return head
    from localspec.runtime.plan import library_here

    library = library_here().library
    if library is not None and library.layer is not None:
        head.use_kernels(library.layer, library.q8)
    return head


def clear_head_cache() -> None:
    _HEADS.clear()


def load_head_proposer(folder, target_model: torch.nn.Module, device=None) -> HeadProposer:
    """A fresh proposer (its own caches) over a head loaded once per folder and target."""
    return HeadProposer(cached_head(folder, target_model, device))
