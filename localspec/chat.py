"""Chat on top of the engine: messages → prompt ids (with a stated truncation policy), ids → text per token."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Optional

from localspec.config import ConfigError, SamplingParams, SpecConfig, check_max_new_tokens, require_proposer
from localspec.engine.events import StepEvent
from localspec.engine.loop import Engine
from localspec.models.loading import LoadedPair
from localspec.models.stop_tokens import stop_token_ids
from localspec.proposers import DraftModelProposer, NgramProposer
from localspec.proposers.base import Proposer
from localspec.proposers.lookup_first import LookupFirstProposer

TRUNCATION_POLICY = (
    "When a conversation no longer fits the model's context, the oldest turns are left out first (the system "
    "prompt and your latest message are kept); a single message longer than the context keeps only its end."
)
MAX_MESSAGE_CHARS = 200_000


class IncrementalDetokenizer:
    """Turns token ids into text piece by piece, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""  # wait for the rest of a multi-byte character
        piece = text[len(self.text) :] if text.startswith(self.text) else text
        self.text = text
        return piece


LOOKUP_FIRST_MIN_N = 2  # ngram+head: shortest n-gram match the lookup drafts from before the head takes over


class ChatSession:
    """One loaded model pair, ready to answer chats. Builds proposers on demand."""

    def __init__(self, loaded: LoadedPair) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.engine = Engine(loaded.target, stop_token_ids(self.tokenizer), exact=loaded.exact_on)
        decision = loaded.dtype
        timed = [t for t in decision.timings if t.dtype == decision.dtype] if decision is not None else []
        if timed:  # the target's own 1-token and (K+1)-token forwards, timed at load on this machine
            self.engine.controllers.verify.set_prior(timed[0].plain_s, timed[0].verify_s, decision.k + 1)
        from localspec.verify.warmup import warm_up_sampler

        warm = warm_up_sampler(loaded.device, loaded.spec.k)  # 'auto' falls back to torch when Triton fails here
        self._notices = loaded.notices + ((warm,) if warm else ())

    @property
    def proposers(self) -> tuple[str, ...]:
        """The entry's proposers that loaded (a draft or head that failed is left out; see loaded.notices)."""
        return self.loaded.proposers

    @property
    def notices(self) -> tuple[str, ...]:
        """Why a part is not offered (a draft or head that failed to load), or why 'auto' samples with torch."""
        return self._notices

    def make_proposer(self, spec: SpecConfig) -> Optional[Proposer]:
        pair = self.loaded.spec
        if spec.proposer == "none":
            return None
        if spec.proposer not in self.proposers:
            dropped = [n for n in self.notices if n.startswith(spec.proposer.split("+")[-1])]
            require_proposer(pair.name, spec.proposer, self.proposers, f" ({dropped[0]})" if dropped else "")
        if spec.proposer == "ngram":
            return NgramProposer(spec.ngram_min, spec.ngram_max)
        if spec.proposer == "draft":
            if self.loaded.draft is None:
                raise ConfigError(f"model pair {pair.name!r}: the draft model is not loaded")
            return DraftModelProposer(self.loaded.draft, self.engine.target.vocab_size)
        if spec.proposer in ("head", "ngram+head"):
            from localspec.proposers.head import HeadProposer

            head = HeadProposer(self.loaded.head)  # fresh caches over the head loaded with the pair
            if spec.proposer == "head":
                return head
            # the lookup drafts only on a match of ≥ 2 tokens: a 1-token match is a weaker guess than the head's
            # (16 held-out prompts, K = 2, mean acceptance length HumanEval / MT-Bench: 1.96 / 1.54 with min_n 2,
            # 1.78 / 1.52 with min_n 1, 1.72 / 1.44 for the head alone)
            min_n = min(max(LOOKUP_FIRST_MIN_N, spec.ngram_min), spec.ngram_max)
            return LookupFirstProposer(NgramProposer(min_n, spec.ngram_max), head)
        raise ConfigError(f"unknown proposer {spec.proposer!r}")

    def tree_nodes_of(self, spec: SpecConfig) -> int:
        """The size of the token trees an answer with this spec drafts: spec.tree_nodes where its proposer drafts
        trees and the target verifies them (the preallocated cache), else 0: it drafts chains of K
        (engine/tree_step.py)."""
        if spec.tree_nodes <= 0 or spec.proposer == "none" or not self.engine.target.supports_tree:
            return 0
        proposer = self.make_proposer(spec)
        return spec.tree_nodes if proposer is not None and proposer.supports_tree else 0

    def default_spec(self, **overrides) -> SpecConfig:
        pair = self.loaded.spec
        ngram = pair.ngram
        base = SpecConfig(
            proposer=self.loaded.default_proposer,
            k=pair.k,
            adaptive=pair.adaptive,
            tree_nodes=pair.tree_nodes,
            ngram_min=ngram.min_n if ngram else 1,
            ngram_max=ngram.max_n if ngram else 4,
        )
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    def prompt_ids(self, messages: list[dict], max_new_tokens: int) -> tuple[list[int], Optional[str]]:
        """Apply the chat template; drop the oldest turns (then cut the last message) to fit. Returns (ids, notice)."""
        from localspec.store.validation import validate_messages

        messages = validate_messages(messages)
        check_max_new_tokens(max_new_tokens)
        if not messages or not str(messages[-1].get("content", "")).strip():
            raise ConfigError("the message is empty; type something to send")
        budget = self.engine.max_context - min(max_new_tokens, self.engine.max_context // 2)
        messages = [{"role": m["role"], "content": str(m["content"])[-MAX_MESSAGE_CHARS:]} for m in messages]
        system = [m for m in messages if m["role"] == "system"][:1]
        turns = [m for m in messages if m["role"] != "system"]
        notice = None
        while True:
            ids = self._template(system + turns)
            if len(ids) <= budget:
                return ids, notice
            if not turns:
                raise ConfigError("the system prompt is longer than this model's context; shorten it")
            if len(turns) > 1:
                turns = turns[1:]
                notice = "Older turns were left out to fit the context. " + TRUNCATION_POLICY
                continue
            last = turns[-1]
            content_ids = self.tokenizer.encode(last["content"], add_special_tokens=False)
            overflow = len(ids) - budget
            if overflow >= len(content_ids):
                raise ConfigError("the conversation's fixed parts do not fit this model's context")
            kept = self.tokenizer.decode(content_ids[overflow + 8 :])
            turns = [{"role": last["role"], "content": kept}]
            notice = "Your message was longer than the context; only its end was kept. " + TRUNCATION_POLICY

    def _template(self, messages: list[dict]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return list(out)

    def stream(
        self, messages: list[dict], sampling: SamplingParams, spec: SpecConfig, cancel: Optional[threading.Event] = None
    ) -> Iterator[StepEvent]:
        """Yield the engine's step events with each token's text filled in."""
        sampling.validate()
        ids, _notice = self.prompt_ids(messages, sampling.max_new_tokens)
        yield from self.stream_ids(ids, sampling, spec, cancel)

    def stream_ids(
        self, ids: list[int], sampling: SamplingParams, spec: SpecConfig, cancel: Optional[threading.Event] = None
    ) -> Iterator[StepEvent]:
        proposer = self.make_proposer(spec)
        detok = IncrementalDetokenizer(self.tokenizer)
        for event in self.engine.generate(ids, sampling, spec, proposer, cancel):
            tokens = tuple(replace(tok, text=detok.push(tok.token_id)) for tok in event.tokens)
            yield replace(event, tokens=tokens)
