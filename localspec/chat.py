"""Chat on top of the engine: messages → prompt ids (with a stated truncation policy), ids → text per token."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Optional

from localspec.config import (
    ConfigError,
    NgramSpec,
    SamplingParams,
    SpecConfig,
    check_max_new_tokens,
    require_proposer,
)
from localspec.engine.events import EngineEvent, StepEvent
from localspec.engine.loop import Engine
from localspec.engine.policy import drafts_trees
from localspec.models.chat_template import template_ids
from localspec.models.loading import LoadedPair
from localspec.models.stop_tokens import stop_token_ids
from localspec.models.work_budget import BudgetSpent, WorkBudget
from localspec.proposers import DraftModelProposer, NgramProposer
from localspec.proposers.base import Proposer
from localspec.proposers.grammar import GrammarGuidedProposer
from localspec.proposers.history import HistoryProposer, SuffixIndex
from localspec.proposers.lookup_first import LookupFirstProposer
from localspec.runtime.plan import ForwardPlan
from localspec.structured.grammar import Constraint, GrammarTokenizer

TRUNCATION_POLICY = (
    "When a conversation no longer fits the model's context, the oldest turns are left out first (the system "
    "messages and your latest message are kept); a single message longer than the context keeps only its end."
)
MAX_MESSAGE_CHARS = 200_000
PROMPT_LIMIT_S = 20.0  # the most a prompt's template, tokenization and truncation may take, together


class PromptTooLong(ConfigError):
    """A prompt that does not fit the context, when truncation was not asked for (the API's default)."""

    def __init__(self, prompt_tokens: int, budget: int, context: int, reserved: int) -> None:
        super().__init__(
            f"the prompt has {prompt_tokens} tokens; this model's context of {context} tokens leaves {budget} for "
            f"the prompt ({reserved} are kept for the answer)"
        )
        self.prompt_tokens, self.budget, self.context, self.reserved = prompt_tokens, budget, context, reserved


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


MODEL_PROPOSERS = ("head", "draft")  # the proposers that run a model: their drafting cost is timed at load
LOOKUP_FIRST_MIN_N = 2  # ngram+head: shortest n-gram match the lookup drafts from before the head takes over


def _verify_prior(loaded: LoadedPair, plan: ForwardPlan) -> tuple[float, float, int] | None:
    """(1-token seconds, (K+1)-token seconds, K+1) of the target in the setup its engine runs: the dtype
    decision's load-time timings where they are of that setup (the fast one), else timed now (about 20 forwards:
    the exact setup's rows cost another share of a step, on the layer kernel more than the fast setup's)."""
    if plan.setup_id == "fast":
        decision = loaded.dtype
        timed = [t for t in decision.timings if t.dtype == decision.dtype] if decision is not None else []
        return (timed[0].plain_s, timed[0].verify_s, decision.k + 1) if timed else None
    from localspec.models.dtype_choice import time_forwards

    rows = max(loaded.spec.k, 1) + 1
    measured = time_forwards({"target": loaded.target}, (1, rows), setups={"target": plan.setup}).get("target")
    return (measured[1], measured[rows], rows) if measured else None


class ChatSession:
    """One loaded model pair, ready to answer chats. Builds proposers on demand."""

    def __init__(self, loaded: LoadedPair) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.engine = Engine(loaded.target, stop_token_ids(self.tokenizer), exact=loaded.exact_on)
        prior = _verify_prior(loaded, self.engine.target.plan)
        if prior is not None:  # the target's own 1-token and (K+1)-token forwards, timed on this machine
            self.engine.controllers.verify.set_prior(*prior)
        self.engine.controllers.propose_priors.update(self._propose_priors())
        from localspec.verify.warmup import warm_up_sampler

        warm = warm_up_sampler(loaded.device, loaded.spec.k)  # 'auto' falls back to torch when Triton fails here
        self._notices = loaded.notices + ((warm,) if warm else ())
        # what the 'history' proposers look up besides the current conversation: the app fills it from the saved
        # conversations of this pair (store/history.py); empty for the CLI, the bench and --no-save
        self.history = SuffixIndex()
        self.grammars = GrammarTokenizer(self.tokenizer, sorted(self.engine.stop_token_ids))

    def _propose_priors(self) -> dict[str, float]:
        """Seconds per drafted token of each loaded model proposer (head, draft), timed now on this machine
        (proposers/timing.py): where one fails to draft, its controllers start without a prior, as before."""
        from localspec.proposers.timing import seconds_per_token

        priors = {}
        for name in MODEL_PROPOSERS:
            if name not in self.proposers:
                continue
            try:
                proposer = self.make_proposer(self.default_spec(proposer=name))
                seconds = seconds_per_token(proposer, self.vocab_size, proposer.feature_size)
            except Exception:  # a prior only saves the first steps' trials: a part that fails runs without one
                seconds = None
            if seconds is not None:
                priors[name] = seconds
        return priors

    @property
    def vocab_size(self) -> int:
        """Rows of the target's output: every token id the session emits or drafts is below it."""
        return self.engine.target.vocab_size

    @property
    def proposers(self) -> tuple[str, ...]:
        """The entry's proposers that loaded (a draft or head that failed is left out; see loaded.notices)."""
        return self.loaded.proposers

    @property
    def notices(self) -> tuple[str, ...]:
        """Why a part is not offered (a draft or head that failed to load), or why 'auto' samples with torch."""
        return self._notices

    def make_proposer(self, spec: SpecConfig, first_source: list[int] | tuple[int, ...] = ()) -> Optional[Proposer]:
        """The proposer spec names. first_source: token ids the history proposers search first (on Regenerate and
        Edit-and-resend, the answer being replaced)."""
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
        if spec.proposer == "history":
            return HistoryProposer(self.history, spec.ngram_min, first_source=first_source)
        if spec.proposer in ("head", "ngram+head", "history+head"):
            from localspec.proposers.head import HeadProposer

            head = HeadProposer(self.loaded.head)  # fresh caches over the head loaded with the pair
            if spec.proposer == "head":
                return head
            if spec.proposer == "history+head":
                return LookupFirstProposer(
                    HistoryProposer(self.history, spec.ngram_min, first_source=first_source), head
                )
            # the lookup drafts only on a match of ≥ 2 tokens: a 1-token match is a weaker guess than the head's
            # (16 held-out prompts, K = 2, mean acceptance length HumanEval / MT-Bench: 1.96 / 1.54 with min_n 2,
            # 1.78 / 1.52 with min_n 1, 1.72 / 1.44 for the head alone)
            min_n = min(max(LOOKUP_FIRST_MIN_N, spec.ngram_min), spec.ngram_max)
            return LookupFirstProposer(NgramProposer(min_n, spec.ngram_max), head)
        raise ConfigError(f"unknown proposer {spec.proposer!r}")

    def answer_parts(
        self, spec: SpecConfig, first_source: list[int] | tuple[int, ...] = (), constraint: Optional[Constraint] = None
    ) -> tuple[Optional[Proposer], tuple]:
        """(proposer, target processors) of one answer: with a constraint, its grammar's mask on the target and its
        forced tokens drafted around the entry's proposer's free parts (proposers/grammar.py), for the API and the
        bench alike."""
        processors = (self.grammars.processor(constraint),) if constraint is not None else ()
        proposer = self.make_proposer(spec, first_source)
        if processors and proposer is not None:
            lookup = NgramProposer(1, spec.ngram_max)
            if spec.adaptive and proposer.wants_hidden:
                # the adaptive setting's head drafts a constrained answer's free parts at a loss: on the tuning
                # JSON-schema prompts the lookup alone ran 1.69x plain constrained decoding against 1.61x with the
                # head beside it (3 runs each, Zen 4, 2026-12-08), and the target computes no features for it
                proposer = NgramProposer(1, spec.ngram_max)
            proposer = GrammarGuidedProposer(processors[0], proposer, lookup)
        return proposer, processors

    def answer_spec(self, spec: SpecConfig) -> SpecConfig:
        """spec as the engine runs it: tree_nodes 0 where the answer drafts chains of K (engine/policy.py's
        drafts_trees: a proposer that drafts trees and a target that verifies them)."""
        if spec.tree_nodes <= 0:
            return spec
        trees = drafts_trees(spec, self.make_proposer(spec), self.engine.target.supports_tree)
        return spec if trees else replace(spec, tree_nodes=0)

    def default_spec(self, **overrides) -> SpecConfig:
        pair = self.loaded.spec
        ngram = pair.ngram
        base = SpecConfig(
            proposer=self.loaded.default_proposer,
            k=pair.k,
            adaptive=pair.adaptive,
            tree_nodes=pair.tree_nodes,
            ngram_min=(ngram or NgramSpec()).min_n,
            ngram_max=(ngram or NgramSpec()).max_n,
        )
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    def prompt_ids(
        self,
        messages: list[dict],
        max_new_tokens: int,
        truncate: bool = True,
        cancel: Optional[threading.Event] = None,
        tools: Optional[list[dict]] = None,
    ) -> tuple[list[int], Optional[str]]:
        """Apply the chat template, every system message in its place (merged at the start, and said so, when the
        template refuses that). When the prompt does not fit: with truncate, drop the oldest turns (then cut the last
        message) in one pass; without, raise PromptTooLong. Returns (ids, notice).

        The model's template and the user's text are outside input: the whole of it runs within PROMPT_LIMIT_S and
        stops when `cancel` is set (BudgetSpent, a ConfigError naming the template when that was running).

        tools: function tools for a template that reads `tools`; the messages may then hold `tool_calls` and
        `role: "tool"` in the Hugging Face form (structured/tools.py: checked by the API, not by the store's rules)."""
        from localspec.store.validation import validate_messages

        budget = WorkBudget("building the prompt", PROMPT_LIMIT_S, cancel)
        messages = validate_messages(messages) if tools is None else [dict(m) for m in messages]
        check_max_new_tokens(max_new_tokens)
        if not messages or not str(messages[-1].get("content", "")).strip():
            raise ConfigError("the message is empty; type something to send")
        reserved = min(max_new_tokens, self.engine.max_context // 2)
        room = self.engine.max_context - reserved
        messages = [{**m, "content": str(m["content"])[-MAX_MESSAGE_CHARS:]} for m in messages]
        messages, ids, merged = self._with_systems(messages, budget, tools)
        if len(ids) <= room:
            return ids, merged
        if not truncate:
            raise PromptTooLong(len(ids), room, self.engine.max_context, reserved)
        ids, notice = self._fit(messages, ids, room, budget, tools)
        return ids, " ".join(n for n in (merged, notice) if n)

    def _with_systems(
        self, messages: list[dict], budget: WorkBudget, tools: Optional[list[dict]] = None
    ) -> tuple[list[dict], list[int], Optional[str]]:
        """(messages, their ids, notice): as given when the template takes them; otherwise every system message
        joined, in order, into one at the start (templates that allow a single leading system message)."""
        systems = [m for m in messages if m["role"] == "system"]
        in_place = len(systems) <= 1 and (not systems or messages[0]["role"] == "system")
        try:
            return messages, self._template(messages, budget, tools), None
        except BudgetSpent:
            raise
        except Exception:  # the template's own refusal (jinja raise_exception): retried merged, else reported
            if in_place:
                raise
        joined = {"role": "system", "content": "\n\n".join(m["content"] for m in systems)}
        merged = [joined] + [m for m in messages if m["role"] != "system"]
        notice = (
            f"This model's chat template takes one system message at the start: the {len(systems)} system "
            "messages were joined there, in their order."
        )
        return merged, self._template(merged, budget, tools), notice

    def _fit(
        self, messages: list[dict], ids: list[int], room: int, budget: WorkBudget, tools: Optional[list[dict]] = None
    ) -> tuple[list[int], str]:
        """Leave out the oldest turns, then cut the last message, until the prompt fits: each turn is tokenized
        once, and the template is applied again only to correct the estimate (each time dropping ≥ 1 more turn),
        so the work is linear in the conversation (system messages and the last message are always kept)."""
        last = len(messages) - 1
        droppable = [i for i, m in enumerate(messages[:last]) if m["role"] != "system"]
        overhead = self._message_overhead(budget)
        cost = {i: len(self._encode(messages[i]["content"], budget)) + overhead for i in droppable}
        dropped: set[int] = set()
        notice = ""
        while len(ids) > room and len(dropped) < len(droppable):
            over = len(ids) - room
            for i in droppable:
                if over <= 0:
                    break
                if i not in dropped:
                    dropped.add(i)
                    over -= cost[i]
            ids = self._template([m for i, m in enumerate(messages) if i not in dropped], budget, tools)
            notice = "Older turns were left out to fit the context. " + TRUNCATION_POLICY
        if len(ids) <= room:
            return ids, notice
        kept = [m for i, m in enumerate(messages) if i not in dropped]
        if len(kept) == 1 and kept[0]["role"] == "system":
            raise ConfigError("the system prompt is longer than this model's context; shorten it")
        content_ids = self._encode(kept[-1]["content"], budget)
        margin = 8  # re-tokenizing the kept end can merge differently at its first character
        for _attempt in range(4):
            overflow = len(ids) - room
            if overflow <= 0:
                return ids, "Your message was longer than the context; only its end was kept. " + TRUNCATION_POLICY
            if overflow + margin >= len(content_ids):
                break
            content_ids = content_ids[overflow + margin :]
            kept[-1] = {**kept[-1], "content": self.tokenizer.decode(content_ids)}
            ids = self._template(kept, budget, tools)
            margin *= 2
        raise ConfigError("the conversation's fixed parts do not fit this model's context")

    def _message_overhead(self, budget: WorkBudget) -> int:
        """Tokens the template adds around one message's content (role markers), measured on two short turns."""
        one = [{"role": "user", "content": "a"}]
        two = one + [{"role": "assistant", "content": "a"}]
        try:
            extra = len(self._template(two, budget)) - len(self._template(one, budget))
        except BudgetSpent:
            raise
        except Exception:  # a template that refuses the pair: an estimate only (the loop corrects it)
            return 4
        return max(0, extra - len(self.tokenizer.encode("a", add_special_tokens=False)))

    def _template(
        self, messages: list[dict], budget: Optional[WorkBudget] = None, tools: Optional[list[dict]] = None
    ) -> list[int]:
        """The chat template applied under the budget (a template is a program the model file brings); alone, under
        a budget of its own."""
        part = f"the chat template of {self.loaded.spec.name!r}"
        budget = budget or WorkBudget("applying the chat template", PROMPT_LIMIT_S)
        try:
            return budget.run(
                template_ids, self.tokenizer, messages, add_generation_prompt=True, tools=tools, part=part
            )
        except BudgetSpent as exc:
            if exc.reason == "cancelled":
                raise
            raise BudgetSpent(f"{exc}; the template is broken or hostile: choose another model", exc.reason) from None

    def _encode(self, text: str, budget: WorkBudget) -> list[int]:
        """A message's tokens (native code, bounded by the text's size): the budget is looked at before and after."""
        budget.check()
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        budget.check()
        return ids

    def stream(
        self, messages: list[dict], sampling: SamplingParams, spec: SpecConfig, cancel: Optional[threading.Event] = None
    ) -> Iterator[EngineEvent]:
        """Yield the engine's events with each token's text filled in (a PrefillProgress as it came)."""
        sampling.validate()
        ids, _notice = self.prompt_ids(messages, sampling.max_new_tokens, cancel=cancel)
        yield from self.stream_ids(ids, sampling, spec, cancel)

    def stream_ids(
        self,
        ids: list[int],
        sampling: SamplingParams,
        spec: SpecConfig,
        cancel: Optional[threading.Event] = None,
        first_source: list[int] | tuple[int, ...] = (),
        constraint: Optional[Constraint] = None,
    ) -> Iterator[EngineEvent]:
        """The engine's events, each step's tokens with their text. first_source: what the history proposers search
        first (see make_proposer). constraint: a grammar the answer follows (structured/grammar.py), applied to the
        target's distribution at every position."""
        proposer, processors = self.answer_parts(spec, first_source, constraint)
        detok = IncrementalDetokenizer(self.tokenizer)
        for event in self.engine.generate(ids, sampling, spec, proposer, cancel, processors):
            if not isinstance(event, StepEvent):
                yield event
                continue
            tokens = tuple(replace(tok, text=detok.push(tok.token_id)) for tok in event.tokens)
            yield replace(event, tokens=tokens)
