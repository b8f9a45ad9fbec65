"""Engine events → OpenAI response bodies and chunks (chat.completion, text_completion), stop strings applied.

Without `localspec: {provenance: true}` the bodies are plain OpenAI. With it, each choice (each streamed chunk's
choice) gains `localspec: {tokens: [...]}` with every token's kind, p_target and p_draft, and `usage` gains
drafted_tokens, accepted_tokens, acceptance_rate, mean_acceptance_length and time_to_first_token_s (seconds from the
engine taking the request to its first token: the prompt's prefill and the first step; null before one).
`top_logprobs` (chat) and `logprobs: n` (completions) are of the distribution the sampler drew from at each position
(after temperature and top-p).
"""

from __future__ import annotations

import math
import time
import uuid

from localspec.engine.events import StatsSnapshot, StepEvent, TokenEvent
from localspec.structured.stops import StopScan
from localspec.structured.tools import ToolCall, ToolStream

from .metrics import Outcome
from .schemas import GenerationRequest

LOGPROB_FLOOR = -9999.0  # what OpenAI reports for a probability that underflows


def logprob(p: float) -> float:
    return math.log(p) if p > 0 else LOGPROB_FLOOR


def token_logprob(tok: TokenEvent) -> float:
    """The token's log-probability: the one read with its top_logprobs when they were asked for (the same value as
    its entry there), else log p_target."""
    return finite(tok.logprob) if tok.logprob is not None else logprob(tok.target_prob)


def finite(lp: float) -> float:
    """A log-probability as JSON can carry it: log 0 (a token top-k / top-p masked out) becomes the floor."""
    return lp if math.isfinite(lp) else LOGPROB_FLOOR


class Collector:
    """Accumulates one answer's tokens; releases text (holding back a possible start of a stop string)."""

    def __init__(
        self, request: GenerationRequest, tokenizer, fingerprint: str | None = None, notice: str | None = None
    ) -> None:
        self.request = request
        self.tokenizer = tokenizer
        self.fingerprint = fingerprint  # system_fingerprint: model, dtype, weight format (runner.fingerprint)
        self.notice = notice  # what the prompt lost or merged (truncation, system messages): localspec.notice
        self.scan = StopScan(request.stop)  # the text, and how much of it (and of the tokens) is released
        self.tokens: list[TokenEvent] = []
        self.finish_reason: str | None = None
        self.stats = StatsSnapshot()
        self.delivered = 0  # tokens of the released ones whose chunk (or body) was handed to the client
        self.delivered_stats = StatsSnapshot()  # the stats as of the last delivery: what its usage says
        self.done = False
        self.id = ("chatcmpl-" if request.endpoint == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        # with tools: the released text split into content and tool calls (structured/tools.py)
        self.tool_stream = ToolStream(request.tools) if request.tools is not None else None
        self.content = ""  # with tools: the content released so far (the text less its tool calls)
        self.new_calls: list[ToolCall] = []  # calls parsed but not yet put in a chunk
        self.created = int(time.time())

    @property
    def text(self) -> str:
        return self.scan.text

    @property
    def sent(self) -> int:
        """The released text ends here."""
        return self.scan.sent

    @property
    def released(self) -> int:
        """Tokens handed out so far."""
        return self.scan.released

    def add(self, event: StepEvent) -> tuple[str, list[TokenEvent]]:
        """The text and tokens this event releases. After a stop string (done), further events release nothing."""
        if self.done:
            return "", []
        self.tokens.extend(event.tokens)
        self.stats = event.stats
        piece, released = self.scan.add([tok.text for tok in event.tokens], event.finished)
        if self.scan.cut is not None:
            self.finish_reason = "stop"
        elif event.finished:
            self.finish_reason = event.finish_reason
        self.done = self.scan.done
        out = [self.tokens[i] for i in released]
        if self.tool_stream is not None:
            piece, calls = self.tool_stream.push(piece, done=self.done)
            self.content += piece
            self.new_calls += calls
            if self.done and self.tool_stream.calls and self.finish_reason == "stop":
                self.finish_reason = "tool_calls"  # OpenAI's reason for an answer that calls tools
        return piece, out

    def take_calls(self) -> list[dict]:
        """The tool calls parsed since the last chunk, as streamed deltas (index: the call's place in the answer)."""
        first = len(self.tool_stream.calls) - len(self.new_calls) if self.tool_stream is not None else 0
        deltas = [{"index": first + i, **call.to_openai()} for i, call in enumerate(self.new_calls)]
        self.new_calls = []
        return deltas

    # ---- pieces of the bodies -------------------------------------------------------------------------------
    def provenance(self, tokens: list[TokenEvent]) -> dict:
        return {"tokens": [tok.to_dict() for tok in tokens]}

    def _top(self, tok: TokenEvent) -> list[tuple[str, float]]:
        """(text, log-probability) of the position's most likely tokens, most likely first; [] when not asked."""
        return [(self.tokenizer.decode([token_id]), finite(lp)) for token_id, lp in tok.top_logprobs or ()]

    def _top_by_text(self, tok: TokenEvent) -> dict[str, float]:
        """The completions shape {text: log-probability}; of tokens that decode alike, the most likely one stays."""
        out: dict[str, float] = {}
        for text, lp in self._top(tok):
            out.setdefault(text, lp)
        return out

    def chat_logprobs(self, tokens: list[TokenEvent]) -> dict:
        content = []
        for tok in tokens:
            text = self.tokenizer.decode([tok.token_id])
            top = [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for t, lp in self._top(tok)]
            content.append(
                {
                    "token": text,
                    "logprob": token_logprob(tok),
                    "bytes": list(text.encode("utf-8")),
                    "top_logprobs": top,
                }
            )
        return {"content": content}

    def completion_logprobs(self, tokens: list[TokenEvent], first_offset: int) -> dict:
        texts = [self.tokenizer.decode([tok.token_id]) for tok in tokens]
        offsets, at = [], first_offset
        for text in texts:
            offsets.append(at)
            at += len(text)
        return {
            "tokens": texts,
            "token_logprobs": [token_logprob(t) for t in tokens],
            "top_logprobs": [self._top_by_text(t) for t in tokens] if self.request.sampling.top_logprobs else None,
            "text_offset": offsets,
        }

    def usage(self, prompt_tokens: int) -> dict:
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": self.released,
            "total_tokens": prompt_tokens + self.released,
        }
        if self.request.extension.provenance:
            usage.update(
                drafted_tokens=self.stats.drafted,
                accepted_tokens=self.stats.accepted,
                acceptance_rate=self.stats.acceptance_rate,
                mean_acceptance_length=self.stats.mean_acceptance_length,
                time_to_first_token_s=self.stats.first_token_s,
            )
        return usage

    def _head(self, object_: str) -> dict:
        return {
            "id": self.id,
            "object": object_,
            "created": self.created,
            "model": self.request.model,
            "system_fingerprint": self.fingerprint,
        }

    @property
    def shows_tokens(self) -> bool:
        """Whether a chunk with tokens but no text carries anything (logprobs or provenance were asked for)."""
        return self.request.logprobs or self.request.extension.provenance

    def mark_delivered(self) -> None:
        """Everything released so far reached the client (a chunk was sent, or the whole body is being)."""
        self.delivered, self.delivered_stats = self.released, self.stats

    def outcome(self, prompt_tokens: int, finish_reason: str | None = None) -> Outcome:
        """What this response told its client, for the metrics (the one source of finish reason and tokens): the
        tokens delivered and their drafting, never those generated for a client that left before they were sent."""
        reason = finish_reason or self.finish_reason or "cancelled"
        return Outcome(reason, prompt_tokens, self.delivered, self.stats.elapsed_s, self.delivered_stats)

    def _decorate(self, choice: dict, tokens: list[TokenEvent], offset: int) -> dict:
        if self.request.logprobs:
            choice["logprobs"] = (
                self.chat_logprobs(tokens)
                if self.request.endpoint == "chat"
                else self.completion_logprobs(tokens, offset)
            )
        if self.request.extension.provenance:
            choice["localspec"] = self.provenance(tokens)
        return choice

    # ---- whole bodies -----------------------------------------------------------------------------------------
    def chunk(
        self,
        piece: str,
        tokens: list[TokenEvent],
        finish_reason: str | None = None,
        first: bool = False,
        offset: int = 0,
    ) -> dict:
        if self.request.endpoint == "chat":
            delta = {"role": "assistant", "content": piece} if first else ({"content": piece} if piece else {})
            calls = self.take_calls()
            if calls:
                delta["tool_calls"] = calls
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish_reason}
            body = self._head("text_completion")
        body["choices"] = [self._decorate(choice, tokens, offset)]
        if first and self.notice:
            body["localspec"] = {"notice": self.notice}
        return body

    def usage_chunk(self, prompt_tokens: int) -> dict:
        body = self._head("chat.completion.chunk" if self.request.endpoint == "chat" else "text_completion")
        body.update(choices=[], usage=self.usage(prompt_tokens))
        return body

    def final(self, prompt_tokens: int) -> dict:
        """The non-streaming body of the whole answer."""
        tokens = self.tokens[: self.released]
        text = self.text[: self.sent]
        if self.tool_stream is not None and self.tool_stream.buffer:  # held back, and the answer has ended
            self.content += self.tool_stream.push("", done=True)[0]
        if self.request.endpoint == "chat":
            message = {"role": "assistant", "content": text}
            if self.tool_stream is not None and self.tool_stream.calls:
                message = {
                    "role": "assistant",
                    "content": self.content or None,
                    "tool_calls": [call.to_openai() for call in self.tool_stream.calls],
                }
            elif self.tool_stream is not None:
                message["content"] = self.content
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": self.finish_reason,
            }
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
            body = self._head("text_completion")
        body.update(choices=[self._decorate(choice, tokens, 0)], usage=self.usage(prompt_tokens))
        if self.notice:
            body["localspec"] = {"notice": self.notice}
        self.mark_delivered()
        return body
