"""The speculative decoding loop. Knows only token ids; yields one StepEvent per target forward."""
from __future__ import annotations

import threading
import time
from typing import Iterator, Optional

import torch

from .adaptive import AdaptiveController
from localspec.config import ConfigError, SamplingParams, SpecConfig
from .events import StepEvent, TokenEvent
from .metrics import SpecStats
from .model_runner import ModelRunner
from .timing import synced_clock
from localspec.proposers.base import Proposer
from localspec.verify import get_verifier, make_draws


class NumericalError(RuntimeError):
    """The model produced NaN or infinite logits."""


class Engine:
    """Pairs a target model with proposers. One answer at a time (the caller serialises requests)."""

    def __init__(self, target_model: torch.nn.Module, stop_token_ids: set[int] | frozenset[int] = frozenset()) -> None:
        self.target = ModelRunner(target_model)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.lock = threading.Lock()
        # per (proposer, K, adaptive): measured costs and acceptance, kept across answers (costs are the machine's)
        self.controllers: dict[tuple[str, int, bool], AdaptiveController] = {}

    @property
    def max_context(self) -> int:
        return self.target.max_context

    def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        spec: SpecConfig,
        proposer: Optional[Proposer] = None,
        cancel: Optional[threading.Event] = None,
    ) -> Iterator[StepEvent]:
        """Propose K → score K+1 positions in one target forward → rejection-sample → roll caches back.

        proposer None (or spec.proposer == 'none') is plain autoregressive decoding through the same loop: the
        baseline every speedup is measured against.
        """
        sampling.validate()
        spec.validate()
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        if len(prompt_ids) >= self.max_context:
            raise ConfigError(
                f"the prompt has {len(prompt_ids)} tokens; this model's context holds {self.max_context}")
        if spec.proposer == "none":
            proposer = None
        max_new = min(sampling.max_new_tokens, self.max_context - len(prompt_ids))
        max_k = spec.k if proposer is not None else 0
        self.sampler_name, verify = get_verifier(spec.sampler, self.target.device)
        generator = torch.Generator(device=self.target.device).manual_seed(sampling.seed)
        stats = SpecStats(max_k)
        wants_hidden = proposer is not None and proposer.wants_hidden
        # a head may read earlier target layers too (multi-layer features); they come from the same forwards
        feature_layers = tuple(getattr(proposer, "feature_layers", ())) if wants_hidden else ()
        try:
            yield from self._loop(prompt_ids, sampling, spec, proposer, cancel, max_new, max_k, verify, generator, stats,
                                  wants_hidden, feature_layers)
        except Exception as exc:  # a model that breaks mid-answer ends the answer with a message, not a traceback
            yield StepEvent((), 0.0, 0.0, 0.0, 0, 0, stats.snapshot(), True, "error",
                            f"generation failed: {type(exc).__name__}: {exc}")

    def _loop(self, prompt_ids, sampling, spec, proposer, cancel, max_new, max_k, verify, generator, stats, wants_hidden,
              feature_layers):
        target = self.target
        device = target.device
        with self.lock:
            # told each step's costs and outcome, it predicts the speedup (the break-even meter); when adaptive it
            # also picks K each step (0 = plain step)
            # A proposer made of parts (ngram+head) names the part that will draft next (`part(context)`); each part
            # gets its own controller, since the parts differ in cost and acceptance (and so in their best K).
            controller = None
            begun: set[str] = set()

            def controller_for(part: str) -> AdaptiveController:
                found = self.controllers.setdefault((part, max_k, spec.adaptive), AdaptiveController(max_k))
                if part not in begun:
                    found.begin()
                    begun.add(part)
                return found

            part_of = getattr(proposer, "part", None)
            target.reset()
            t0 = time.perf_counter()
            prompt_hidden = None
            if len(prompt_ids) > 1:
                prompt_hidden = target.extend(prompt_ids[:-1], want_hidden=wants_hidden, logits_to_keep=0,
                                              feature_layers=feature_layers).hidden
            if proposer is not None:
                proposer.begin(list(prompt_ids), prompt_hidden)
            stats.prefill_s = time.perf_counter() - t0
            context = list(prompt_ids)
            pending = prompt_ids[-1]  # the last known token: its logits are the first verified position
            produced = 0
            while produced < max_new:
                if cancel is not None and cancel.is_set():
                    yield StepEvent((), 0.0, 0.0, 0.0, 0, 0, stats.snapshot(), True, "cancelled")
                    return
                # never draft past the token budget: K+1 tokens may be emitted
                budget_k = min(max_k, max_new - produced - 1)
                k = budget_k
                if proposer is not None:
                    controller = controller_for(f"{proposer.name}:{part_of(context)}" if part_of else proposer.name)
                if controller is not None and spec.adaptive:
                    k = min(k, controller.choose_k())
                asked = k

                t_propose = time.perf_counter()
                draft_ids: list[int] = []
                draft_probs = None
                if proposer is not None and k > 0:
                    draft = proposer.propose(context, k, sampling, generator)
                    draft_ids = list(draft.token_ids[:k])
                    if draft.probs is not None and draft_ids:
                        draft_probs = draft.probs[: len(draft_ids)].unsqueeze(0)  # [1, K, V]
                        if not bool(torch.isfinite(draft_probs).all()):  # a NaN draft: this step runs plain
                            draft_ids, draft_probs = [], None
                            stats.dropped_drafts += 1
                k = len(draft_ids)

                t_score = synced_clock(device)
                forward = target.extend([pending] + draft_ids, want_hidden=wants_hidden, feature_layers=feature_layers)
                target_logits = forward.logits.unsqueeze(0)  # [1, K+1, V]

                t_sample = synced_clock(device)  # the forward has finished: the split is right on a GPU
                draws = None if sampling.greedy else make_draws(generator, 1, k, target_logits.shape[-1], device)
                draft_tensor = torch.tensor([draft_ids], dtype=torch.long, device=device).view(1, k)
                result = verify(target_logits, draft_tensor, draft_probs, sampling, draws)
                finite = torch.isfinite(target_logits).all().to(torch.float32).view(1)
                # the one host transfer of the step: ids, count, probabilities, finiteness
                packed = torch.cat([
                    result.output_token_ids[0].to(torch.float64),
                    result.num_accepted.to(torch.float64),
                    result.target_probs_of_drafts[0].to(torch.float64),
                    result.draft_probs_of_drafts[0].to(torch.float64),
                    result.target_prob_of_last.to(torch.float64),
                    finite.to(torch.float64),
                ]).tolist()
                t_done = time.perf_counter()

                if packed[-1] != 1.0:
                    yield StepEvent((), 0.0, 0.0, 0.0, k, 0, stats.snapshot(), True, "error",
                                    "the target produced NaN or infinite logits; the answer was stopped")
                    return
                num_accepted = int(packed[k + 1])
                emitted = [int(t) for t in packed[: num_accepted + 1]]
                target_probs_of_drafts = packed[k + 2: 2 * k + 2]
                draft_probs_of_drafts = packed[2 * k + 2: 3 * k + 2]
                target_prob_of_last = packed[3 * k + 2]

                # roll the target cache back to the accepted length (drop the rejected drafts)
                target.crop(len(target.tokens) - (k - num_accepted))

                tokens = []
                for i, token_id in enumerate(emitted):
                    if i < num_accepted:
                        tokens.append(TokenEvent(token_id, "accepted", target_probs_of_drafts[i],
                                                 draft_probs_of_drafts[i]))
                    elif num_accepted < k:
                        tokens.append(TokenEvent(
                            token_id, "resampled", target_prob_of_last,
                            rejected_token_id=draft_ids[num_accepted],
                            rejected_target_prob=target_probs_of_drafts[num_accepted],
                            rejected_draft_prob=draft_probs_of_drafts[num_accepted]))
                    else:
                        tokens.append(TokenEvent(token_id, "bonus" if k > 0 else "target", target_prob_of_last))

                finish_reason = None
                for i, token_id in enumerate(emitted):
                    if token_id in self.stop_token_ids:
                        emitted, tokens, finish_reason = emitted[: i + 1], tokens[: i + 1], "stop"
                        break
                produced += len(emitted)
                if finish_reason is None and produced >= max_new:
                    finish_reason = "length"
                context.extend(emitted)
                if proposer is not None and finish_reason is None:
                    hidden = forward.hidden[: num_accepted + 1] if wants_hidden else None
                    proposer.on_verified(num_accepted, emitted, hidden)
                pending = emitted[-1]
                if controller is not None:
                    controller.observe(asked, k, num_accepted, t_score - t_propose, t_done - t_score)
                    stats.k = asked
                    if budget_k > 0:  # the last step of a length-capped answer cannot draft: it predicts nothing
                        stats.predicted_speedup = controller.predicted(asked)
                stats.record_step(k, num_accepted, len(emitted), t_score - t_propose, t_sample - t_score,
                                  t_done - t_sample)
                yield StepEvent(
                    tokens=tuple(tokens),
                    propose_time_us=(t_score - t_propose) * 1e6,
                    score_time_us=(t_sample - t_score) * 1e6,
                    sampler_time_us=(t_done - t_sample) * 1e6,
                    propose_token_num=k,
                    accept_token_num=num_accepted,
                    stats=stats.snapshot(),
                    finished=finish_reason is not None,
                    finish_reason=finish_reason,
                )
                if finish_reason is not None:
                    return
