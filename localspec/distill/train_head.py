"""Train a feature-level head with training-time test: steps 2..K read the head's own fed-back hidden states,
attending to real entries up to the chain's start plus the chain's own earlier entries, exactly as at inference."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from localspec.heads.model import FeatureHead

from .batches import Batch, iterate_batches, make_batch


def shift(x: torch.Tensor, by: int, dim: int = 1) -> torch.Tensor:
    """Along `dim` (the sequence axis): out[i] = x[i - by], zeros for i < by."""
    if by == 0:
        return x
    x = x.transpose(1, dim)
    out = torch.cat([torch.zeros_like(x[:, :by]), x[:, :-by]], dim=1)
    return out.transpose(1, dim)


def chain_attention(q, real_k, real_v, offset: int, chain: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """q [B, h, S, d]; real_k/v [B, kv, S, d]: query i sees real keys 0..i-offset and one key per chain entry
    (already shifted to line up with the query). Returns [B, h, S, d]."""
    repeat = q.shape[1] // real_k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    real_k = real_k.repeat_interleave(repeat, dim=1)
    real_v = real_v.repeat_interleave(repeat, dim=1)
    s = q.shape[2]
    scores = (q @ real_k.transpose(-1, -2)) * scale  # [B, h, S, S]
    idx = torch.arange(s, device=q.device)
    allowed = idx[None, :] <= idx[:, None] - offset
    scores = scores.masked_fill(~allowed, float("-inf"))
    chain_scores = [(q * k.repeat_interleave(repeat, dim=1)).sum(-1, keepdim=True) * scale for k, _ in chain]
    weights = torch.softmax(torch.cat([scores] + chain_scores, dim=-1), dim=-1)  # [B, h, S, S + len(chain)]
    weights_real = torch.nan_to_num(weights[..., :s])
    out = weights_real @ real_v
    for c, (_, v) in enumerate(chain):
        out = out + weights[..., s + c : s + c + 1] * v.repeat_interleave(repeat, dim=1)
    return out


@dataclass(frozen=True)
class StepMetrics:
    loss: float
    agreement: list[float]  # per draft step: argmax(head) == argmax(target over the draft vocab)
    positions: int


def ttt_forward(
    head: FeatureHead,
    batch: Batch,
    steps: int,
    reg_weight: float = 0.1,
    step_decay: float = 0.8,
    hard_weight: float = 0.0,
    collect_logits: Optional[list] = None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Returns (loss, per-step agreement counts, per-step position counts). collect_logits, when given, receives each
    step's logits [B, S, Vd] over the draft vocabulary.

    The distillation term is (1 - hard_weight) × soft cross-entropy to the target's distribution + hard_weight ×
    cross-entropy to the target's argmax. Greedy acceptance asks only whether the head's argmax is the target's;
    where the target's distribution is flat, the soft term spreads the head over the near-ties, the hard one
    trains exactly that question."""
    config = head.config
    b, s = batch.tokens.shape
    prev_real = head.project_features(batch.prev_hidden)  # [B, S, H] what the head reads of the target at p - 1
    target_last = batch.target_hidden[..., -config.hidden_size :]  # [B, S, H] the last hidden it predicts at p
    embedding = head.embedding[batch.tokens]  # [B, S, H]
    positions = torch.arange(1, s + 1, device=batch.tokens.device)
    cos, sin = head.rope(positions)
    lm = head.draft_lm_weight  # [Vd, H]
    with torch.no_grad():
        teacher_logits = target_last @ lm.T  # [B, S, Vd]
        teacher_probs = torch.softmax(teacher_logits, dim=-1)
        teacher_top = teacher_logits.argmax(-1)  # [B, S]
    real_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    chain: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}  # step -> (module, k, v)
    prev = prev_real
    total = torch.zeros((), device=prev.device)
    agree, counts = [], []
    for step in range(1, steps + 1):
        module = config.module_for_step(step)
        layer = head.layers[module]
        anchor = shift(prev_real, step - 1)
        attn_input, residual = layer.fuse(prev, embedding, anchor)
        q, k, v = layer.qkv(attn_input, cos, sin)
        if step == 1:
            real_kv[module] = (k, v)
        if module not in real_kv:  # an MTP module's own real stream (target hidden, real tokens)
            real_in, _ = layer.fuse(prev_real, embedding, prev_real)
            _, rk, rv = layer.qkv(real_in, cos, sin)
            real_kv[module] = (rk, rv)
        if step > 1:
            chain[step] = (module, k, v)
        entries = [
            (shift(ck, step - i, dim=2), shift(cv, step - i, dim=2))
            for i, (m, ck, cv) in sorted(chain.items())
            if m == module
        ]
        out = chain_attention(q, *real_kv[module], step - 1, entries)
        hidden = head.norms[module](layer.finish(out, residual))  # [B, S, H]
        logits = hidden @ lm.T  # [B, S, Vd]
        if collect_logits is not None:
            collect_logits.append(logits.detach())
        mask = batch.valid & (torch.arange(s, device=prev.device) >= step - 1)[None]
        n = mask.sum().clamp(min=1)
        log_probs = torch.log_softmax(logits, dim=-1)  # [B, S, Vd]
        ce = -(teacher_probs * log_probs).sum(-1)  # [B, S]
        if hard_weight:
            hard = -log_probs.gather(-1, teacher_top[..., None])[..., 0]  # [B, S]
            ce = (1.0 - hard_weight) * ce + hard_weight * hard
        reg = F.smooth_l1_loss(hidden, target_last, reduction="none").mean(-1)  # [B, S]
        total = total + (step_decay ** (step - 1)) * ((ce + reg_weight * reg) * mask).sum() / n
        agree.append(((logits.argmax(-1) == teacher_top) & mask).sum().detach())
        counts.append(mask.sum().detach())
        prev = shift(hidden, 1)
    return total, agree, counts


@torch.no_grad()
def evaluate(head, pieces: list, steps: int, batch_size: int = 8, forward=None) -> StepMetrics:
    forward = forward or ttt_forward
    device = next(head.parameters()).device
    head.eval()
    loss_sum, n_batches = 0.0, 0
    agree = [0.0] * steps
    counts = [0.0] * steps
    for i in range(0, len(pieces), batch_size):
        batch = make_batch(pieces[i : i + batch_size], device)
        loss, a, c = forward(head, batch, steps)
        loss_sum += float(loss)
        n_batches += 1
        for j in range(len(a)):
            agree[j] += float(a[j])
            counts[j] += float(c[j])
    head.train()
    return StepMetrics(loss_sum / max(n_batches, 1), [a / max(c, 1) for a, c in zip(agree, counts)], int(counts[0]))


def expected_acceptance_length(agreement: list[float]) -> float:
    """Greedy: tokens per target forward if step j is accepted with its conditional agreement (1 + Σ Π a_i)."""
    total, run = 1.0, 1.0
    for a in agreement:
        run *= a
        total += run
    return total


def train_head(
    head: torch.nn.Module,
    train_pieces: list,
    val_pieces: list,
    steps: int,
    out_dir: Path,
    save: Callable[[FeatureHead], None],
    lr: float = 5e-4,
    batch_size: int = 8,
    max_updates: int = 100_000,
    minutes: Optional[float] = None,
    eval_every: int = 200,
    patience: int = 4,
    seed: int = 0,
    resume: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = True,
    forward=None,
    batches: Optional[Iterator[Batch]] = None,
) -> dict:
    """AdamW with warmup + cosine decay; validation every eval_every updates keeps the best head (saved through
    `save`), stops after `patience` evaluations without improvement or when time runs out. A checkpoint
    (weights, optimizer, update count) is written at each evaluation for --resume. `batches` replaces the shuffled
    train_pieces (e.g. text teacher-forced on the fly, see stream.py)."""
    forward = forward or ttt_forward
    device = next(head.parameters()).device
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    checkpoint_path = out_dir / "checkpoint.pt"
    update, best, bad_evals, history = 0, float("inf"), 0, []
    if resume and checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=False)
        head.load_state_dict(state["head"])
        if hasattr(head, "set_draft_vocab"):  # the loaded draft vocabulary replaces the picked one: drop its cache
            head.set_draft_vocab(head.draft_token_ids)
        optimizer.load_state_dict(state["optimizer"])
        update, best, bad_evals, history = state["update"], state["best"], state["bad_evals"], state["history"]
        log(f"resumed at update {update} (best validation loss {best:.4f})")
    warmup = min(100, max_updates // 10 + 1)

    def lr_at(u: int) -> float:
        if u < warmup:
            return lr * (u + 1) / warmup
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (u - warmup) / max(1, max_updates - warmup)))))

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_updates, initial=update, desc="training", unit="upd", dynamic_ncols=True)
    t0 = time.time()
    if batches is None:
        batches = iterate_batches(train_pieces, batch_size, seed + update, device)
    head.train()
    stop_reason = "max updates"
    while update < max_updates:
        batch = next(batches)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(update)
        loss, agree, counts = forward(head, batch, steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        loss = loss.detach()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        update += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss):.3f}", a1=f"{float(agree[0]) / max(float(counts[0]), 1):.2f}")
        out_of_time = minutes is not None and time.time() - t0 > minutes * 60
        if update % eval_every == 0 or update == max_updates or out_of_time:
            metrics = evaluate(head, val_pieces, steps, batch_size, forward) if val_pieces else None
            val_loss = metrics.loss if metrics else float(loss)
            record = {
                "update": update,
                "train_loss": float(loss),
                "val_loss": val_loss,
                "val_agreement": metrics.agreement if metrics else None,
                "minutes": (time.time() - t0) / 60,
            }
            history.append(record)
            agreement = ", ".join(f"{a:.2f}" for a in (metrics.agreement if metrics else []))
            log(
                f"update {update}: train {float(loss):.3f}  val {val_loss:.3f}  agreement per step [{agreement}]"
                + (f"  E≈{expected_acceptance_length(metrics.agreement):.2f}" if metrics else "")
            )
            if val_loss < best - 1e-4:
                best, bad_evals = val_loss, 0
                save(head)
            else:
                bad_evals += 1
            torch.save(
                {
                    "head": head.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "update": update,
                    "best": best,
                    "bad_evals": bad_evals,
                    "history": history,
                },
                checkpoint_path,
            )
            if bad_evals >= patience:
                stop_reason = "early stopping (validation loss stopped improving)"
                break
            if out_of_time:
                stop_reason = "time limit"
                break
    if bar is not None:
        bar.close()
    if best == float("inf"):
        save(head)
    return {
        "updates": update,
        "best_val_loss": best,
        "stop_reason": stop_reason,
        "history": history,
        "minutes": (time.time() - t0) / 60,
    }
