"""llama.cpp as a peer in `localspec bench`: its own C++ (llama-server, llama-bench), never a Python loop around it.

The same GGUF file, the same chat-templated prompt ids, greedy, the same max new tokens and thread count, timed like
our modes (prefill included, end to end). Modes:
- llama.cpp: plain decoding;
- llama.cpp-lookup: llama.cpp's prompt lookup (--spec-type ngram-simple, llama_server.LOOKUP_TOKENS per step);
- llama.cpp-draft: llama.cpp's draft-model speculation (-md) with the pair's draft, where that is a GGUF file, K
  tokens per step (the pair's k);
- ik_llama.cpp: ik_llama.cpp's llama-server, plain decoding, where `make setup-bench-ik` built it (the fastest CPU
  engine as a peer, end to end). Its /completion returns text, not ids: the bench counts an answer by the server's
  own count (predicted_n) and compares answers by their text tokenized again (modes.run_llama_cpp).
Each mode's server starts when the mode first runs and stops when the bench run ends (runner.py calls stop_servers
in a finally); llama-bench's pp512 and tg128 on the target's file go into the report beside them
(`llama_bench_line`), and so do ik_llama.cpp's where `make setup-bench-ik` built it (`peer_bench_lines`).
"""

from __future__ import annotations

from pathlib import Path

from . import llama_bin
from .llama_server import LOOKUP_TOKENS, Completion, LlamaServer, Speculation, free_port, server_command

LLAMA_MODES = ("llama.cpp", "llama.cpp-lookup", "llama.cpp-draft", "ik_llama.cpp")
MODE_PEERS = {"ik_llama.cpp": llama_bin.IK_LLAMA}  # the modes another peer than llama.cpp runs
NOT_GGUF = "not a GGUF file"


def peer_of(mode: str) -> llama_bin.Peer:
    return MODE_PEERS.get(mode, llama_bin.LLAMA_CPP)


def _gguf(source: str) -> tuple[Path | None, str | None]:
    """(the GGUF file a source names, None) or (None, why not)."""
    from localspec.config import ConfigError
    from localspec.models.loading import gguf_path

    try:
        path = gguf_path(source)
    except ConfigError as exc:
        return None, str(exc)
    return (path, None) if path is not None else (None, NOT_GGUF)


def why_not(pair) -> dict[str, str | None]:
    """mode → None when it can run on this pair, else why not."""
    _target, why = _gguf(pair.target.source)
    why = f"the target is {why}" if why == NOT_GGUF else why
    reasons: dict[str, str | None] = {mode: why or llama_bin.missing(peer_of(mode)) for mode in LLAMA_MODES}
    if reasons["llama.cpp-draft"] is None:
        if pair.draft is None:
            reasons["llama.cpp-draft"] = f"pair {pair.name!r} has no draft model"
        else:
            _draft, why_draft = _gguf(pair.draft.source)
            if why_draft is not None:
                reasons["llama.cpp-draft"] = f"the pair's draft ({pair.draft.source}) is {why_draft}"
    return reasons


def speculation(pair, mode: str) -> Speculation | None:
    if mode == "llama.cpp-lookup":
        return Speculation("lookup", LOOKUP_TOKENS)
    if mode == "llama.cpp-draft":
        draft, why = _gguf(pair.draft.source) if pair.draft is not None else (None, "missing")
        if draft is None:
            from localspec.config import ConfigError

            raise ConfigError(f"llama.cpp-draft needs a GGUF draft model; pair {pair.name!r}'s is {why}")
        return Speculation("draft", pair.k, draft)
    return None


_EXTRA_ARGS: dict[str, tuple[str, ...]] = {}  # peer name → more llama-server options (`bench --peer-args`)


def set_peer_args(extra: dict[str, tuple[str, ...]]) -> None:
    """More llama-server options for a peer's servers from now on (`localspec bench --peer-args NAME=ARGS`), e.g. a
    smaller -ub where a peer's batched path computes a file wrongly; they are part of each server's command line."""
    unknown = sorted(set(extra) - set(llama_bin.PEERS))
    if unknown:
        from localspec.config import ConfigError

        raise ConfigError(f"--peer-args: no peer named {', '.join(unknown)} (peers: {', '.join(llama_bin.PEERS)})")
    _EXTRA_ARGS.clear()
    _EXTRA_ARGS.update(extra)


def peer_args() -> dict[str, list[str]]:
    return {name: list(args) for name, args in _EXTRA_ARGS.items()}


# (peer, file, threads, speculation) → its server
_SERVERS: dict[tuple[str, str, int, Speculation | None], LlamaServer] = {}


def server_for(
    model: Path, threads: int, spec: Speculation | None, peer: llama_bin.Peer = llama_bin.LLAMA_CPP
) -> LlamaServer:
    key = (peer.name, str(model), threads, spec)
    if key not in _SERVERS:
        port = free_port()
        binary = llama_bin.binary("llama-server", peer)
        command = server_command(binary, model, threads, port, spec, peer.server_options)
        command += _EXTRA_ARGS.get(peer.name, ())
        _SERVERS[key] = LlamaServer(command, port, returns_ids=peer.returns_ids)
    return _SERVERS[key]


def stop_servers() -> None:
    """Stop every server server_for started."""
    while _SERVERS:
        _SERVERS.popitem()[1].stop()


def target_file(pair) -> Path:
    path, why = _gguf(pair.target.source)
    if path is None:
        from localspec.config import ConfigError

        raise ConfigError(f"the llama.cpp modes need a GGUF target; {pair.target.source} is {why}")
    return path


def answer(pair, mode: str, threads: int, prompt_ids: list[int], max_new_tokens: int) -> Completion:
    """One greedy answer from the mode's C++ peer on the pair's target file, in `mode`'s speculation."""
    server = server_for(target_file(pair), threads, speculation(pair, mode), peer_of(mode))
    return server.complete(prompt_ids, max_new_tokens)


def llama_bench_line(pair, threads: int, peer: llama_bin.Peer = llama_bin.LLAMA_CPP) -> dict:
    """The peer's llama-bench pp512 / tg128 on the target's file (LlamaBench.to_dict()), or {"error": why} when it
    could not run: the bench's other numbers stand without it."""
    from localspec.config import ConfigError

    from .llama_bench import run_llama_bench

    try:
        return run_llama_bench(llama_bin.binary("llama-bench", peer), target_file(pair), threads).to_dict()
    except ConfigError as exc:
        return {"error": str(exc)}


def peer_bench_lines(pair, threads: int) -> dict[str, dict]:
    """Each other peer's llama-bench line (llama.cpp's is llama_bench_line's), or {"error": why} where it is not
    built or failed."""
    return {
        peer.name: llama_bench_line(pair, threads, peer)
        for peer in llama_bin.PEERS.values()
        if peer is not llama_bin.LLAMA_CPP
    }
