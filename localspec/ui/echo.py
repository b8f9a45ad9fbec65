"""A model-free session that answers with the user's own message, token by token, in every token kind.

For the browser tests and the streaming benchmark: the window's rendering (markdown, colours, injection cases) is
checked with text chosen by the test instead of what a random tiny model happens to say. Run the window on it
with `python -m localspec.ui.echo [--port N] [--step-ms MS]`.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Optional

from localspec.config import ModelSpec, PairSpec, SamplingParams, SpecConfig
from localspec.engine.events import EngineEvent, PrefillProgress, StatsSnapshot, StepEvent, TokenEvent

PIECE = re.compile(r"\s+|\w{1,4}|[^\w\s]{1,2}")  # roughly how a BPE tokenizer cuts text
CYCLE = ("accepted", "accepted", "resampled", "bonus", "target")
READ_CHUNK = 512  # prompt tokens "read" per step_s when the session is given a prompt length (the engine's chunk)
ECHO_PAIR = PairSpec(name="echo", target=ModelSpec(source="echo"), k=3, default_proposer="ngram")


def pieces(text: str) -> list[str]:
    return PIECE.findall(text)


class _Tokenizer:
    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return f"<draft {ids[0]}>" if ids else ""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return []  # echo drafts nothing: the history index of its saved messages stays empty


class EchoSession:
    """Answers each message with its own text; token kinds cycle accepted, accepted, resampled, bonus, target.
    Its speculation defaults are its entry's (default proposer, K, tree nodes, adaptive). With prompt_tokens over
    READ_CHUNK it first reads that long a prompt as the engine does, a PrefillProgress per chunk of step_s."""

    notices: tuple[str, ...] = ()  # nothing of a pair failed to load
    vocab_size: Optional[int] = None  # no model: its history index holds no ids to check

    def __init__(self, step_s: float = 0.0, pair: PairSpec = ECHO_PAIR, prompt_tokens: int = 0) -> None:
        self.step_s = step_s
        self.prompt_tokens = prompt_tokens
        self.pair = pair
        self.tokenizer = _Tokenizer()
        self.loaded = None
        self._text = ""

    @property
    def proposers(self) -> tuple[str, ...]:
        return self.pair.proposers

    def default_spec(self, **overrides) -> SpecConfig:
        pair = self.pair
        base = SpecConfig(proposer=pair.default_proposer, k=pair.k, tree_nodes=pair.tree_nodes, adaptive=pair.adaptive)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    def answer_spec(self, spec: SpecConfig) -> SpecConfig:
        """Echo drafts nothing; it reports the tree size asked for, as a proposer that drafts trees would."""
        return spec if spec.proposer != "none" else replace(spec, tree_nodes=0)

    def prompt_ids(
        self, messages: list[dict], max_new_tokens: int, truncate: bool = True, cancel: Optional[threading.Event] = None
    ) -> tuple[list[int], Optional[str]]:
        self._text = str(messages[-1].get("content", ""))
        return [0], None

    def stream_ids(
        self,
        ids: list[int],
        sampling: SamplingParams,
        spec: SpecConfig,
        cancel: Optional[threading.Event] = None,
        first_source: tuple[int, ...] = (),
    ) -> Iterator[EngineEvent]:
        parts = pieces(self._text)[: sampling.max_new_tokens]
        started, emitted = time.perf_counter(), 0
        yield from self._read(started)
        prefill_s = time.perf_counter() - started
        score_s, first_token_s = 0.0, None  # its "forward" is the step's sleep; the rest of the time is other
        for step in range(0, len(parts), 2):
            if cancel is not None and cancel.is_set():
                yield StepEvent((), 0.0, 0.0, 0.0, 0, 0, StatsSnapshot(emitted=emitted), True, "cancelled")
                return
            tokens = []
            for i, text in enumerate(parts[step : step + 2], start=step):
                kind = CYCLE[i % len(CYCLE)]
                if kind == "resampled":
                    tokens.append(
                        TokenEvent(
                            i,
                            kind,
                            0.4,
                            rejected_token_id=i + 1000,
                            rejected_target_prob=0.1,
                            rejected_draft_prob=0.5,
                            text=text,
                        )
                    )
                else:
                    tokens.append(TokenEvent(i, kind, 0.8, 0.9 if kind == "accepted" else None, text=text))
            emitted += len(tokens)
            if self.step_s:
                slept = time.perf_counter()
                time.sleep(self.step_s)
                score_s += time.perf_counter() - slept
            first_token_s = first_token_s if first_token_s is not None else time.perf_counter() - started
            done = step + 2 >= len(parts)
            stats = StatsSnapshot(
                drafted=emitted,
                accepted=emitted // 2,
                emitted=emitted,
                target_forwards=step // 2 + 1,
                elapsed_s=time.perf_counter() - started,
                prefill_s=prefill_s,
                score_s=score_s,
                k=3,
                first_token_s=first_token_s,
            )
            yield StepEvent(tuple(tokens), 0.0, 0.0, 0.0, len(tokens), 1, stats, done, "stop" if done else None)
        if not parts:
            yield StepEvent((), 0.0, 0.0, 0.0, 0, 0, StatsSnapshot(), True, "stop")

    def _read(self, started: float) -> Iterator[PrefillProgress]:
        total = self.prompt_tokens
        if total <= READ_CHUNK:
            return
        for read in (*range(READ_CHUNK, total, READ_CHUNK), total):
            time.sleep(self.step_s)
            yield PrefillProgress(read, total, time.perf_counter() - started)


def echo_manager(step_s: float = 0.0):
    from .manager import ModelManager

    manager = ModelManager([ECHO_PAIR], lambda _pair, _progress: EchoSession(step_s))
    manager.load("echo")
    return manager


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.ui.echo", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--step-ms", type=float, default=20.0, help="pause per step of two tokens")
    args = parser.parse_args(argv)
    from . import build_app, launch_options

    demo = build_app(echo_manager(args.step_ms / 1000))
    demo.queue(default_concurrency_limit=None)
    demo.launch(server_name="127.0.0.1", server_port=args.port, share=False, **launch_options())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
