"""The fused Triton rejection sampler: the GPU path, checked token for token against verify/reference.py.

Same signature and outputs as `rejection_sample`, so the engine can swap them. No [B, K+1, V] probability tensor is
made: the target softmax (with temperature) is computed online over V in blocks. The work is split into three
launches, none of which reads anything back to the host:

1. `_row_stats_kernel`, grid (B*(K+1) rows, S vocabulary splits): per split, the running max and the sum of
   exp(logit/T - max) (online softmax), and in greedy mode the argmax of the raw logits (lowest index on ties).
2. `_sample_partials_kernel` (stochastic only), same grid: with the row's max and sum, the target probabilities
   p_target(v) of the split; the residual max(0, p_target - p_draft) and, per split, the argmax of residual / noise
   and of p_target / noise (the exponential-noise sample, as `sample_with_noise`), and whether the residual is
   non-zero anywhere.
3. `_finalize_kernel`, grid (B,): all K+1 positions of a row at once, as a [32, splits] tile: combines the partials,
   runs the acceptance tests, finds the accepted prefix (the first position not accepted), picks the resampled or
   bonus token, and writes the probabilities the events show.

Exactness rules mirrored from the reference: ties go to the lowest index (torch.argmax), logits are divided by the
temperature exactly as torch divides a float32 tensor by a Python float on that device (IEEE division on the CPU, a
multiplication by the float32 reciprocal on CUDA), and keys are IEEE-divided by the noise (`div_rn`). Only exp and the
summation order differ from torch, so the probabilities agree to float32 rounding and tokens agree unless a draw
lands within a rounding error of a decision boundary (probability ~1e-7 per decision).

K and every shape-dependent integer are runtime arguments that Triton must not specialise on (`do_not_specialize`),
so changing K never recompiles. Compile-time constants: the block size, the mode flags, the split count rounded up to
a power of two (depends on V only) and the position tile (32 for every K ≤ 31).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

if not torch.cuda.is_available():
    # Without CUDA, Triton kernels can only run in Triton's interpreter (numpy on the CPU). Triton decides between
    # compiling and interpreting when @triton.jit decorates a function, reading TRITON_INTERPRET at that moment, so the
    # variable must be set before the kernels below are defined (i.e. before importing triton here, and before any
    # other module could have decorated them). setdefault keeps an explicit choice made by the caller.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from localspec.config import ConfigError, SamplingParams  # noqa: E402
from localspec.runtime.sampling import process_logits  # noqa: E402

from .types import SamplerDraws, VerifyOutput  # noqa: E402

INTERPRETED = bool(triton.knobs.runtime.interpret)  # what @triton.jit below decides with

GPU_BLOCK_V = 1024
GPU_TARGET_SPLITS = 32
INTERPRETER_BLOCK_V = 512
INTERPRETER_TARGET_SPLITS = 2

# K, and the integers that change with K (the [B, K] tensors' batch strides): never specialised, so never recompiled.
# V, chunk and the row strides depend on V only: Triton may specialise them (divisible by 16 → vectorised loads).
_RUNTIME_INTS = ["K", "stride_db", "stride_ub"]
INT_MAX = tl.constexpr(2147483647)  # kernels may read module globals only as constexpr

# Reductions are written tl.reduce(x, axis, combine) with Triton's own combine functions rather than tl.max / tl.min /
# tl.sum. Compiled, this is the same thing. Interpreted, it matters twice: the interpreter maps these combine
# functions straight to numpy (while every call of a @jit helper such as tl.max re-patches the language, ~3 ms), and
# it keeps the kernels working when Triton was imported before TRITON_INTERPRET was set (bitsandbytes imports it), in
# which case tl.max & co. are compiled-mode functions that an interpreted kernel cannot call.
_MAX = tl.standard._elementwise_max
_MIN = tl.standard._elementwise_min
_SUM = tl.standard._sum_combine


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _row_stats_kernel(
    logits_ptr,
    stride_row,  # [B*(K+1), V] rows, last dim contiguous: the logits the softmax is taken of
    argmax_ptr,
    stride_arg_row,  # [B*(K+1), V] rows: the logits the greedy argmax is taken of
    part_max_ptr,
    part_sum_ptr,
    part_best_ptr,
    part_best_idx_ptr,  # [B*(K+1), num_splits] each, out
    K,
    V,
    chunk,
    num_splits,
    temperature,
    GREEDY: tl.constexpr,
    SEPARATE_ARGMAX: tl.constexpr,
    MUL_INVERSE: tl.constexpr,
    INDEX_64: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    if INDEX_64:  # the interpreter checks every int32 op for overflow (slow); int64 ops it skips
        row = row.to(tl.int64)
        split = split.to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    arg_ptr = argmax_ptr + row * stride_arg_row
    lanes = tl.arange(0, BLOCK_V)
    if INDEX_64:
        lanes = lanes.to(tl.int64)
    lane_max = tl.full([BLOCK_V], float("-inf"), tl.float32)
    lane_sum = tl.full([BLOCK_V], 0, tl.float32)
    lane_best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    lane_best_idx = tl.full([BLOCK_V], 0, lanes.dtype)
    start = split * chunk
    end = tl.minimum(start + chunk, V)
    for block_start in range(start, end, BLOCK_V):
        offs = tl.multiple_of(block_start, BLOCK_V) + lanes
        mask = offs < end
        x = tl.load(row_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        if MUL_INVERSE:
            z = x * temperature  # temperature holds float32(1 / T) here, as torch computes x / T on CUDA
        else:
            z = tl.math.div_rn(x, tl.full([BLOCK_V], 1.0, tl.float32) * temperature)
        new_max = tl.maximum(lane_max, z)
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # no (-inf) - (-inf)
        lane_sum = lane_sum * tl.exp(lane_max - safe_max) + tl.exp(z - safe_max)
        lane_max = new_max
        if GREEDY:
            if SEPARATE_ARGMAX:
                a = tl.load(arg_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
            else:
                a = x
            better = a > lane_best  # strict: each lane keeps its lowest index among equal values
            lane_best_idx = tl.where(better, offs, lane_best_idx)
            lane_best = tl.where(better, a, lane_best)
    split_max = tl.reduce(lane_max, 0, _MAX)
    safe_split_max = tl.where(split_max == float("-inf"), 0.0, split_max)
    split_sum = tl.reduce(lane_sum * tl.exp(lane_max - safe_split_max), 0, _SUM)
    out = row * num_splits + split
    tl.store(part_max_ptr + out, split_max)
    tl.store(part_sum_ptr + out, split_sum)
    if GREEDY:
        best = tl.reduce(lane_best, 0, _MAX)
        tl.store(part_best_ptr + out, best)
        tl.store(part_best_idx_ptr + out, tl.reduce(tl.where(lane_best == best, lane_best_idx, INT_MAX), 0, _MIN))


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _sample_partials_kernel(
    logits_ptr,
    stride_row,  # [B*(K+1), V] rows
    draft_ids_ptr,
    stride_db,
    stride_dk,  # [B, K]
    draft_probs_ptr,
    stride_draft_row,  # [B*K, V] rows (not read for one-hot n-gram drafts)
    noise_ptr,
    stride_noise_row,  # [B*(K+1), V] rows, Exp(1)
    part_max_ptr,
    part_sum_ptr,  # [B*(K+1), num_splits] from _row_stats_kernel
    res_best_ptr,
    res_idx_ptr,
    tgt_best_ptr,
    tgt_idx_ptr,
    res_max_ptr,  # [B*(K+1), num_splits] each, out
    K,
    V,
    chunk,
    num_splits,
    temperature,
    HAS_DRAFT_PROBS: tl.constexpr,
    MUL_INVERSE: tl.constexpr,
    INDEX_64: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SPLITS_POW2: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    if INDEX_64:  # the interpreter checks every int32 op for overflow (slow); int64 ops it skips
        row = row.to(tl.int64)
        split = split.to(tl.int64)
    b = row // (K + 1)
    j = row % (K + 1)
    # the row's softmax max and normaliser, from every split's partials
    s = tl.arange(0, SPLITS_POW2)
    maxes = tl.load(part_max_ptr + row * num_splits + s, mask=s < num_splits, other=float("-inf"))
    sums = tl.load(part_sum_ptr + row * num_splits + s, mask=s < num_splits, other=0.0)
    row_max = tl.reduce(maxes, 0, _MAX)
    row_sum = tl.reduce(sums * tl.where(maxes == float("-inf"), 0.0, tl.exp(maxes - row_max)), 0, _SUM)

    is_draft_pos = j < K
    draft_token = tl.load(draft_ids_ptr + b * stride_db + j * stride_dk, mask=is_draft_pos, other=-1)
    draft_token = tl.where(is_draft_pos, tl.maximum(draft_token, 0), -1)
    row_ptr = logits_ptr + row * stride_row
    noise_row = noise_ptr + row * stride_noise_row
    probs_row = draft_probs_ptr + (row - b) * stride_draft_row  # draft row b*K + j (only read when j < K)
    lanes = tl.arange(0, BLOCK_V)
    if INDEX_64:
        lanes = lanes.to(tl.int64)
    res_best = tl.full([BLOCK_V], -1.0, tl.float32)
    res_idx = tl.full([BLOCK_V], 0, lanes.dtype)
    tgt_best = tl.full([BLOCK_V], -1.0, tl.float32)
    tgt_idx = tl.full([BLOCK_V], 0, lanes.dtype)
    res_max = tl.full([BLOCK_V], 0, tl.float32)
    start = split * chunk
    end = tl.minimum(start + chunk, V)
    draft_end = tl.where(is_draft_pos, end, 0)  # no draft distribution at the bonus position
    for block_start in range(start, end, BLOCK_V):
        offs = tl.multiple_of(block_start, BLOCK_V) + lanes
        mask = offs < end
        x = tl.load(row_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        if MUL_INVERSE:
            z = x * temperature
        else:
            z = tl.math.div_rn(x, tl.full([BLOCK_V], 1.0, tl.float32) * temperature)
        target_probs = tl.exp(z - row_max) / row_sum
        noise = tl.load(noise_row + offs, mask=mask, other=1.0)
        if HAS_DRAFT_PROBS:
            # (offs < draft_end) rather than mask & is_draft_pos: the interpreter mis-broadcasts a scalar bool in `&`
            draft_probs = tl.load(probs_row + offs, mask=offs < draft_end, other=0.0).to(tl.float32)
        else:
            draft_probs = tl.where(offs == draft_token, 1.0, 0.0)
        residual = tl.maximum(target_probs - draft_probs, 0.0)
        res_key = tl.where(mask, tl.math.div_rn(residual, noise), -1.0)
        tgt_key = tl.where(mask, tl.math.div_rn(target_probs, noise), -1.0)
        better = res_key > res_best  # strict: each lane keeps its lowest index among equal keys
        res_idx = tl.where(better, offs, res_idx)
        res_best = tl.where(better, res_key, res_best)
        better = tgt_key > tgt_best
        tgt_idx = tl.where(better, offs, tgt_idx)
        tgt_best = tl.where(better, tgt_key, tgt_best)
        res_max = tl.maximum(res_max, tl.where(mask, residual, 0.0))
    out = row * num_splits + split
    best = tl.reduce(res_best, 0, _MAX)
    tl.store(res_best_ptr + out, best)
    tl.store(res_idx_ptr + out, tl.reduce(tl.where(res_best == best, res_idx, INT_MAX), 0, _MIN))
    best = tl.reduce(tgt_best, 0, _MAX)
    tl.store(tgt_best_ptr + out, best)
    tl.store(tgt_idx_ptr + out, tl.reduce(tl.where(tgt_best == best, tgt_idx, INT_MAX), 0, _MIN))
    tl.store(res_max_ptr + out, tl.reduce(res_max, 0, _MAX))


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _finalize_kernel(
    logits_ptr,
    stride_row,  # [B*(K+1), V] rows
    draft_ids_ptr,
    stride_db,
    stride_dk,  # [B, K]
    draft_probs_ptr,
    stride_draft_row,  # [B*K, V] rows
    uniforms_ptr,
    stride_ub,
    stride_uk,  # [B, K]
    part_max_ptr,
    part_sum_ptr,  # [B*(K+1), num_splits]
    best_ptr,
    best_idx_ptr,  # greedy: logit argmax partials; stochastic: residual / noise partials
    tgt_best_ptr,
    tgt_idx_ptr,
    res_max_ptr,  # stochastic: p_target / noise partials, residual max
    out_tokens_ptr,
    out_accepted_ptr,
    out_target_probs_ptr,
    out_draft_probs_ptr,
    out_last_prob_ptr,
    K,
    V,
    chunk,
    num_splits,
    temperature,
    GREEDY: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,
    MUL_INVERSE: tl.constexpr,
    POSITIONS_POW2: tl.constexpr,
    SPLITS_POW2: tl.constexpr,
):
    """One batch row: all K+1 positions at once as a [POSITIONS_POW2, SPLITS_POW2] tile (POSITIONS_POW2 is fixed
    at 32 for every K ≤ 31, so K stays a runtime value)."""
    b = tl.program_id(0)
    pos = tl.arange(0, POSITIONS_POW2)  # [P]
    s = tl.arange(0, SPLITS_POW2)  # [S]
    is_pos = pos < K + 1
    is_draft_pos = pos < K
    part = (b * (K + 1) + pos)[:, None] * num_splits + s[None, :]  # [P, S]
    part_mask = is_pos[:, None] & (s < num_splits)[None, :]

    maxes = tl.load(part_max_ptr + part, mask=part_mask, other=float("-inf"))
    sums = tl.load(part_sum_ptr + part, mask=part_mask, other=0.0)
    row_max = tl.reduce(maxes, 1, _MAX)  # [P]
    safe_row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    scale = tl.where(maxes == float("-inf"), 0.0, tl.exp(maxes - safe_row_max[:, None]))
    row_sum = tl.reduce(sums * scale, 1, _SUM)
    row_sum = tl.where(is_pos, row_sum, 1.0)

    draft_tokens = tl.load(draft_ids_ptr + b * stride_db + pos * stride_dk, mask=is_draft_pos, other=0)
    draft_tokens = tl.minimum(tl.maximum(draft_tokens, 0), V - 1)  # memory-safe whatever the ids
    row_ptrs = logits_ptr + (b * (K + 1) + pos) * stride_row  # [P]
    x = tl.load(row_ptrs + draft_tokens, mask=is_draft_pos, other=float("-inf")).to(tl.float32)
    if MUL_INVERSE:
        z = x * temperature
    else:
        z = tl.math.div_rn(x, tl.full([POSITIONS_POW2], 1.0, tl.float32) * temperature)
    target_probs = tl.exp(z - safe_row_max) / row_sum  # [P] p_target(draft token)
    if HAS_DRAFT_PROBS:
        draft_probs = tl.load(
            draft_probs_ptr + (b * K + pos) * stride_draft_row + draft_tokens, mask=is_draft_pos, other=1.0
        ).to(tl.float32)
    else:
        draft_probs = tl.full([POSITIONS_POW2], 1.0, tl.float32)

    best = tl.load(best_ptr + part, mask=part_mask, other=float("-inf"))
    best_idx = tl.load(best_idx_ptr + part, mask=part_mask, other=INT_MAX)
    top = tl.reduce(best, 1, _MAX)
    first_token = tl.reduce(tl.where(part_mask & (best == top[:, None]), best_idx, INT_MAX), 1, _MIN)  # [P]
    if GREEDY:
        fallback = first_token  # the target's argmax
        accepted = draft_tokens == fallback
    else:
        uniforms = tl.load(uniforms_ptr + b * stride_ub + pos * stride_uk, mask=is_draft_pos, other=2.0)
        accepted = uniforms * draft_probs < target_probs
        tgt = tl.load(tgt_best_ptr + part, mask=part_mask, other=float("-inf"))
        tgt_idx = tl.load(tgt_idx_ptr + part, mask=part_mask, other=INT_MAX)
        tgt_top = tl.reduce(tgt, 1, _MAX)
        tgt_token = tl.reduce(tl.where(part_mask & (tgt == tgt_top[:, None]), tgt_idx, INT_MAX), 1, _MIN)
        res_max = tl.reduce(tl.load(res_max_ptr + part, mask=part_mask, other=0.0), 1, _MAX)
        # an all-zero residual (p_target == p_draft) falls back to p_target, as in the reference
        fallback = tl.where(is_draft_pos & (res_max > 0.0), first_token, tgt_token)
    # NaN logits (the engine reports them after this step) can leave no index chosen: stay inside the row
    fallback = tl.minimum(tl.maximum(tl.where(is_pos, fallback, 0), 0), V - 1)
    accepted = accepted & is_draft_pos
    num_accepted = tl.reduce(tl.where(accepted, POSITIONS_POW2, pos), 0, _MIN)  # the first position not accepted
    tokens = tl.where(pos < num_accepted, draft_tokens, tl.where(pos == num_accepted, fallback, -1))

    x_last = tl.load(row_ptrs + fallback, mask=is_pos, other=float("-inf")).to(tl.float32)
    if MUL_INVERSE:
        z_last = x_last * temperature
    else:
        z_last = tl.math.div_rn(x_last, tl.full([POSITIONS_POW2], 1.0, tl.float32) * temperature)
    last_probs = tl.exp(z_last - safe_row_max) / row_sum
    last_prob = tl.reduce(tl.where(pos == num_accepted, last_probs, 0.0), 0, _SUM)

    tl.store(out_target_probs_ptr + b * K + pos, target_probs, mask=is_draft_pos)
    tl.store(out_draft_probs_ptr + b * K + pos, draft_probs, mask=is_draft_pos)
    tl.store(out_tokens_ptr + b * (K + 1) + pos, tokens.to(tl.int64), mask=is_pos)
    tl.store(out_accepted_ptr + b, num_accepted.to(tl.int64))
    tl.store(out_last_prob_ptr + b, last_prob)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def fused_rejection_sample(
    target_logits: torch.Tensor,  # [B, K+1, V] float32 / bfloat16 / float16
    draft_token_ids: torch.Tensor,  # [B, K] int64
    draft_probs: torch.Tensor | None,  # [B, K, V], or None for one-hot (n-gram) drafts
    sampling: SamplingParams,
    draws: SamplerDraws | None,  # None only in greedy mode
    *,
    block_v: int | None = None,
    target_splits: int | None = None,
) -> VerifyOutput:
    """Drop-in replacement for `reference.rejection_sample` (same inputs, same draws → same tokens).

    block_v / target_splits tune the launch (the tests use them to force several blocks and splits on a small V).
    """
    batch, k_plus_1, vocab = target_logits.shape
    k = k_plus_1 - 1
    device = target_logits.device
    greedy = sampling.greedy
    if not greedy and draws is None:
        raise ValueError("stochastic verification needs random draws")
    if device.type != "cuda" and not INTERPRETED:
        raise ConfigError(
            f"the fused Triton sampler runs on CUDA tensors, not {device.type} ones (this process "
            "compiles Triton kernels rather than interpreting them); use sampler 'torch' here"
        )
    filtered = bool(sampling.top_k) or sampling.top_p < 1.0
    if filtered:
        # top-k / top-p need a sort over V: the shared function applies them (and the temperature) before the kernel
        logits = process_logits(target_logits, sampling)  # [B, K+1, V] float32
        temperature = 1.0
    else:
        logits = target_logits
        temperature = 1.0 if greedy else float(sampling.temperature)
    logits = _rows_contiguous(logits)
    argmax_logits = _rows_contiguous(target_logits)  # greedy takes the argmax of the raw logits, as the reference
    mul_inverse = device.type == "cuda"
    temperature_arg = float(np.float32(1.0) / np.float32(temperature)) if mul_inverse else temperature

    if block_v is None:
        block_v = INTERPRETER_BLOCK_V if INTERPRETED else GPU_BLOCK_V
    if target_splits is None:
        target_splits = INTERPRETER_TARGET_SPLITS if INTERPRETED else GPU_TARGET_SPLITS
    chunk = triton.cdiv(triton.cdiv(vocab, target_splits), block_v) * block_v
    num_splits = triton.cdiv(vocab, chunk)
    rows = batch * k_plus_1
    # no FMA contraction: z = x / T and exp(z - max) round as torch's separate operations do
    meta = dict(MUL_INVERSE=mul_inverse, enable_fp_fusion=False)
    runtime = (k, vocab, chunk, num_splits, temperature_arg)

    f32 = dict(device=device, dtype=torch.float32)
    # per-(row, split) partials: two allocations, sliced (each allocation costs host time on the hot path); planes
    # padded to 32 elements so every slice stays 128-byte aligned whatever K is (Triton specialises on alignment)
    plane = triton.cdiv(rows * num_splits, 32) * 32
    float_parts = torch.empty((5, plane), **f32)
    index_parts = torch.empty((2, plane), device=device, dtype=torch.int32)
    part_max, part_sum, best, tgt_best, res_max = (p[: rows * num_splits] for p in float_parts.unbind(0))
    best_idx, tgt_idx = (p[: rows * num_splits] for p in index_parts.unbind(0))
    out_tokens = torch.empty((batch, k_plus_1), device=device, dtype=torch.int64)
    out_accepted = torch.empty((batch,), device=device, dtype=torch.int64)
    out_target_probs = torch.empty((batch, k), **f32)
    out_draft_probs = torch.empty((batch, k), **f32)
    out_last_prob = torch.empty((batch,), **f32)

    draft_ids = draft_token_ids if k > 0 else torch.zeros((batch, 1), device=device, dtype=torch.int64)
    has_draft_probs = draft_probs is not None and k > 0
    probs = _rows_contiguous(draft_probs) if has_draft_probs else logits  # placeholder when unused
    noise = _rows_contiguous(draws.noise) if not greedy else logits  # placeholder when unused
    # kernels launch on the current CUDA device: make it the tensors' (a target on cuda:1 must not launch on 0)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        grid = (rows, num_splits)
        _row_stats_kernel[grid](
            logits,
            logits.stride(1),
            argmax_logits,
            argmax_logits.stride(1),
            part_max,
            part_sum,
            best,
            best_idx,
            *runtime,
            GREEDY=greedy,
            SEPARATE_ARGMAX=greedy and filtered,
            INDEX_64=INTERPRETED,
            BLOCK_V=block_v,
            **meta,
        )
        if greedy:
            uniforms = draft_ids  # placeholders, never read in greedy mode
        else:
            uniforms = draws.uniforms if k > 0 else out_last_prob.view(batch, 1)
            _sample_partials_kernel[grid](
                logits,
                logits.stride(1),
                draft_ids,
                *draft_ids.stride(),
                probs,
                probs.stride(1),
                noise,
                noise.stride(1),
                part_max,
                part_sum,
                best,
                best_idx,
                tgt_best,
                tgt_idx,
                res_max,
                *runtime,
                HAS_DRAFT_PROBS=has_draft_probs,
                INDEX_64=INTERPRETED,
                BLOCK_V=block_v,
                SPLITS_POW2=_next_pow2(num_splits),
                **meta,
            )
        _finalize_kernel[(batch,)](
            logits,
            logits.stride(1),
            draft_ids,
            *draft_ids.stride(),
            probs,
            probs.stride(1),
            uniforms,
            *uniforms.stride(),
            part_max,
            part_sum,
            best,
            best_idx,
            tgt_best,
            tgt_idx,
            res_max,
            out_tokens,
            out_accepted,
            out_target_probs,
            out_draft_probs,
            out_last_prob,
            *runtime,
            GREEDY=greedy,
            HAS_DRAFT_PROBS=has_draft_probs,
            POSITIONS_POW2=max(32, _next_pow2(k_plus_1)),
            SPLITS_POW2=_next_pow2(num_splits),
            **meta,
        )
    return VerifyOutput(
        output_token_ids=out_tokens,
        num_accepted=out_accepted,
        target_probs_of_drafts=out_target_probs,
        draft_probs_of_drafts=out_draft_probs,
        target_prob_of_last=out_last_prob,
    )


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """[B, R, V] whose rows sit at b*R + r times one row stride, vocabulary contiguous (every tensor the engine
    makes). Row addressing by one stride keeps the batch stride, which changes with K, out of the kernels' arguments
    (Triton specialises integer arguments, and the row stride's alignment keeps the loads vectorised)."""
    batch, rows, _vocab = t.shape
    if t.stride(2) == 1 and (batch == 1 or t.stride(0) == rows * t.stride(1)):
        return t
    return t.contiguous()
