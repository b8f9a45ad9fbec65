"""One token-tree step of the engine loop: the proposer drafts a tree → the target scores the pending token and every
node in one forward (tree mask, tree positions) → verify/tree.py walks the longest accepted path → the target's
cache is compacted to that path → the proposer is told, with the target's features at the path's rows.

Used when SpecConfig.tree_nodes > 0, the proposer drafts trees (supports_tree) and the target runs the preallocated
cache (ModelRunner.supports_tree); otherwise the loop runs its chain step. The events are the chain's: accepted
nodes, then the resampled (recovered) or bonus token, each accepted node with the branch it took. Each tree step
tells the part's tree-size controller (adaptive_tree.py) its costs and acceptance, for the predicted speedup; with
SpecConfig.adaptive that controller also picks the step's shape: a tree of N nodes, or a chain / plain step that
the loop's chain step runs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from localspec.verify.tree import TreeVerdict, tree_position_draws, verify_tree

from .events import StepEvent, TokenEvent
from .model_runner import ModelRunner
from .step import NON_FINITE, Run, cut_at_stop, read_top_logprobs
from .timing import synced_clock
from .tree import TokenTree


def tree_step(target: ModelRunner, run: Run, stop_token_ids: frozenset[int]) -> Optional[StepEvent]:
    """One tree step, or None when this step drafts no tree (the loop then runs a chain step)."""
    budget = run.max_new - run.produced - 1  # at most depth + 1 tokens are emitted
    if run.spec.tree_nodes <= 0 or run.proposer is None or not run.proposer.supports_tree:
        return None
    if not target.supports_tree or budget < 1:
        return None
    controller = run.tree_controller_for(run.proposer.part(run.context))
    n_nodes = run.spec.tree_nodes
    if run.spec.adaptive:
        shape, size = controller.choose()
        if shape != "tree":  # a chain of K, or a plain step (K = 0): the loop's chain step runs it
            run.forced_k = size
            return None
        n_nodes = size
    started = time.perf_counter()
    tree = run.proposer.propose_tree(run.context, n_nodes, run.sampling, run.generator)
    if tree is None or tree.size == 0:
        return None
    whole = tree.max_depth <= budget
    tree = tree.within_depth(budget)
    propose_s = time.perf_counter() - started

    device, prefix_len = target.device, len(target.tokens)
    started = synced_clock(device)
    forward = target.extend_tree(run.pending, tree, want_hidden=run.wants_hidden, feature_layers=run.feature_layers)
    scored = synced_clock(device)
    draws = (
        None
        if run.sampling.greedy
        else tree_position_draws(run.sampling.seed, run.produced, tree, forward.logits.shape[-1], device)
    )
    verdict = verify_tree(forward.logits, tree, run.sampling, draws)
    sampler_s = time.perf_counter() - scored
    if not verdict.finite:
        return StepEvent.finished_early(run.snapshot(), "error", NON_FINITE, drafted=tree.size)
    target.keep_path(prefix_len, verdict.rows)

    tokens = tree_token_events(verdict, tree)
    if run.sampling.top_logprobs:
        top = read_top_logprobs(forward.logits[verdict.rows], run.sampling, len(verdict.rows))
        tokens = [replace(token, top_logprobs=t) for token, t in zip(tokens, top)]
    tokens, stopped = cut_at_stop(tokens, stop_token_ids)
    emitted = [token.token_id for token in tokens]
    run.produced += len(emitted)
    finish_reason = "stop" if stopped else "length" if run.produced >= run.max_new else None
    run.context.extend(emitted)
    if finish_reason is None:
        hidden = forward.hidden[verdict.rows] if run.wants_hidden else None  # [num_accepted + 1, F]
        run.proposer.on_verified(verdict.num_accepted, emitted, hidden)
    run.pending = emitted[-1]
    score_s = scored - started
    first_branch = None
    if run.sampling.greedy:  # sampled, a tree's one-hot siblings are accepted unlike the chain's p/q test
        kept = next((i for i, b in enumerate(verdict.branches) if b != 0), len(verdict.branches))
        first_branch = (len(tree.first_branch()), kept)
    controller.observe_tree(
        n_nodes,
        tree.size,
        verdict.num_accepted,
        propose_s,
        score_s + sampler_s,
        whole,
        depth=tree.max_depth,
        first_branch=first_branch,
    )
    stats = replace(run.stats, k=n_nodes, predicted_speedup=controller.predicted(n_nodes), paused=run.pause_reason())
    run.stats = stats.after_step(
        tree.size, verdict.num_accepted, len(emitted), propose_s, score_s, sampler_s, depth=tree.max_depth
    )
    return StepEvent(
        tuple(tokens),
        propose_s * 1e6,
        score_s * 1e6,
        sampler_s * 1e6,
        propose_token_num=tree.size,
        accept_token_num=verdict.num_accepted,
        stats=run.snapshot(),
        finished=finish_reason is not None,
        finish_reason=finish_reason,
    )


def tree_token_events(verdict: TreeVerdict, tree: TokenTree) -> list[TokenEvent]:
    """The accepted nodes (with their branch), then the recovered token as 'resampled' (naming the first child the
    target rejected) or the 'bonus' token at a leaf. Tree nodes are one-hot drafts to the verifier: p_draft 1."""
    n = verdict.num_accepted
    tokens = [
        TokenEvent(token_id, "accepted", p, 1.0, branch=branch)
        for token_id, p, branch in zip(verdict.emitted[:n], verdict.target_probs[:n], verdict.branches)
    ]
    last, p_last = verdict.emitted[n], verdict.target_probs[n]
    if verdict.rejected is not None:
        tokens.append(TokenEvent.resampled(last, p_last, verdict.rejected[0], verdict.rejected[1], 1.0))
    else:
        tokens.append(TokenEvent(last, "bonus" if tree.size else "target", p_last))
    return tokens
