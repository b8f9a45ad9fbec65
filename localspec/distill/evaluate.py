"""Measure a head on held-out prompts: α, mean acceptance length, tokens/s against no proposer (same run,
interleaved per prompt), lossless greedy output, and c = head step time / target one-token step time."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from localspec.config import DEFAULT_K, SamplingParams, SpecConfig
from localspec.engine.events import steps
from localspec.proposers.base import DraftNoise
from localspec.runtime.model_runner import ModelRunner


@dataclass(frozen=True)
class HeldOutReport:
    prompts: int
    k: int
    max_new_tokens: int
    acceptance_rate: float  # accepted / drafted
    mean_acceptance_length: float  # emitted / target forwards
    per_position_acceptance: list  # P(draft position i accepted)
    tokens_per_s_head: float
    tokens_per_s_none: float
    speedup: float
    lossless: bool
    mismatched_prompts: list
    head_step_ms: float
    target_step_ms: float
    c: float

    def to_dict(self) -> dict:
        return asdict(self)


def generate_ids(engine, ids, sampling, spec, proposer):
    """One answer through the engine: (emitted ids, the last step's stats, seconds)."""
    out, stats = [], None
    t0 = time.perf_counter()
    for event in steps(engine.generate(ids, sampling, spec, proposer)):
        out.extend(t.token_id for t in event.tokens)
        stats = event.stats
    return out, stats, time.perf_counter() - t0


@torch.inference_mode()
def measure_c(target, proposer_factory, prompt_ids: list[int], k: int, repeats: int = 20) -> tuple[float, float]:
    """(head ms per draft step, target ms per one-token step), interleaved so load changes hit both."""
    runner = ModelRunner(target)
    runner.reset()
    prefix = prompt_ids[:-1]
    proposer = proposer_factory()
    hidden = runner.extend(prefix, want_hidden=True, feature_layers=proposer.feature_layers).hidden
    proposer.begin(list(prompt_ids), hidden)
    sampling = SamplingParams()
    noise = DraftNoise(torch.Generator())
    proposer.propose(list(prompt_ids), k, sampling, noise)  # warm-up (and the prompt's catch-up)
    head_s, target_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proposer.propose(list(prompt_ids), k, sampling, noise)  # cache cropped each time: same work
        t1 = time.perf_counter()
        runner.extend([prompt_ids[-1]])
        t2 = time.perf_counter()
        runner.crop(len(prefix))
        head_s.append((t1 - t0) / k)
        target_s.append(t2 - t1)
    head_ms = 1000 * sorted(head_s)[len(head_s) // 2]
    target_ms = 1000 * sorted(target_s)[len(target_s) // 2]
    return head_ms, target_ms


TOP_KS = (1, 2, 3, 4)  # the branch counts `--top-k` reports


@torch.no_grad()
def teacher_forced_top_k(
    head, target, rows: list[tuple[list[int], int]], steps: int = 3, ks: tuple[int, ...] = TOP_KS
) -> list[list[float]]:
    """rows: (prompt + the target's greedy answer, prompt length). For each draft step (training-time test: steps
    2.. read the head's own hidden states, with the answer's true tokens before them) and each k, the share of answer
    positions where the target's token is among the head's top k drafts. Top-1 is what a chain can accept; top-k is
    the ceiling of a token tree with k branches at that step."""
    from .batches import make_batch
    from .stream import teacher_forced_pieces
    from .train_head import ttt_forward

    hits = [[0] * len(ks) for _ in range(steps)]
    counts = [0] * steps
    for ids, prompt_len in rows:
        batch = make_batch(teacher_forced_pieces(target, [ids], head.config.feature_layers))
        step_logits: list[torch.Tensor] = []
        ttt_forward(head, batch, steps, collect_logits=step_logits)
        next_ids = torch.as_tensor(ids[2:], dtype=torch.long)  # [S] batch position i predicts ids[i + 2]
        for step, logits in enumerate(step_logits):
            first = prompt_len - 2 + step  # the first answer token, drafted at this step by a chain begun there
            drafts = head.draft_token_ids[logits[0, first:].topk(max(ks), dim=-1).indices]  # [n, max k] token ids
            found = drafts == next_ids[first:, None]  # [n, max k]
            counts[step] += found.shape[0]
            for j, k in enumerate(ks):
                hits[step][j] += int(found[:, :k].any(-1).sum())
    return [[h / max(c, 1) for h in row] for row, c in zip(hits, counts)]


def evaluate_head(
    session, prompts: list[str], proposer_factory, k: int = DEFAULT_K, max_new_tokens: int = 128, log=print
) -> HeldOutReport:
    """Greedy; for each prompt, runs no-proposer then head (same engine, same moment)."""
    engine = session.engine
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    none_tokens = head_tokens = 0
    none_s = head_s = 0.0
    drafted = accepted = forwards = emitted = 0
    per_pos_accept = [0] * k
    per_pos_drafted = [0] * k
    mismatched = []
    for index, prompt in enumerate(prompts):
        ids, _ = session.prompt_ids([{"role": "user", "content": prompt}], max_new_tokens)
        base, _, t_none = generate_ids(engine, ids, sampling, SpecConfig(proposer="none", k=k), None)
        head_spec = SpecConfig(proposer="head", k=k)
        spec_out, stats, t_head = generate_ids(engine, ids, sampling, head_spec, proposer_factory())
        none_tokens += len(base)
        head_tokens += len(spec_out)
        none_s += t_none
        head_s += t_head
        drafted += stats.drafted
        accepted += stats.accepted
        emitted += stats.emitted
        forwards += stats.target_forwards
        for i, (a, d) in enumerate(zip(stats.per_position_accepted, stats.per_position_drafted)):
            if i < k:
                per_pos_accept[i] += a
                per_pos_drafted[i] += d
        if spec_out != base:
            mismatched.append(index)
        log(
            f"prompt {index}: {len(base)} tokens, α {stats.accepted}/{stats.drafted}, "
            f"none {len(base) / t_none:.1f} tok/s, head {len(spec_out) / t_head:.1f} tok/s"
            + ("" if spec_out == base else "  MISMATCH")
        )
    first_ids, _ = session.prompt_ids([{"role": "user", "content": prompts[0]}], 16)
    head_ms, target_ms = measure_c(session.loaded.target, proposer_factory, first_ids, k)
    return HeldOutReport(
        prompts=len(prompts),
        k=k,
        max_new_tokens=max_new_tokens,
        acceptance_rate=accepted / max(drafted, 1),
        mean_acceptance_length=emitted / max(forwards, 1),
        per_position_acceptance=[a / d if d else 0.0 for a, d in zip(per_pos_accept, per_pos_drafted)],
        tokens_per_s_head=head_tokens / head_s,
        tokens_per_s_none=none_tokens / none_s,
        speedup=(head_tokens / head_s) / (none_tokens / none_s),
        lossless=not mismatched,
        mismatched_prompts=mismatched,
        head_step_ms=head_ms,
        target_step_ms=target_ms,
        c=head_ms / target_ms,
    )
