"""llama.cpp's own llama-server as a bench peer: the command line, the /completion request, and the process.

One server per (file, threads, speculation), on a free loopback port, started when a mode first needs it and stopped
by whoever started it (LlamaServer is a context manager; the bench stops every server at its end, error or Ctrl-C
included, and on Linux the server also dies with the bench's process). Its log goes to a temporary file whose tail
the error messages quote; it runs in a temporary folder of its own, removed when it stops.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from localspec.config import ConfigError

CONTEXT_TOKENS = 4096  # --ctx-size: the bench's prompts plus max new tokens fit
READY_SECONDS = 120.0  # the longest a server may take to load its file(s)
REQUEST_SECONDS = 600.0  # the longest one answer may take
STOP_SECONDS = 10.0  # after SIGTERM, before SIGKILL
LOG_TAIL_LINES = 20  # of the server's log, quoted when it fails
# prompt lookup (--spec-type ngram-simple): match the last LOOKUP_NGRAM tokens in the context and draft the
# LOOKUP_TOKENS that followed them, the shape of the earlier llama-cpp-python lookup mode (max_ngram_size 2, 4 tokens)
LOOKUP_NGRAM = 2
LOOKUP_TOKENS = 4


class LlamaServerError(ConfigError):
    """llama-server failed: it would not start, it exited, or it refused a request; the message quotes its log."""


@dataclass(frozen=True)
class Speculation:
    """llama.cpp's speculative decoding on a server: prompt lookup (ngram-simple), or a GGUF draft model
    (draft-simple, -md) drafting up to `tokens` per step."""

    kind: Literal["lookup", "draft"]
    tokens: int
    draft_model: Path | None = None

    def args(self, threads: int) -> list[str]:
        if self.kind == "lookup":
            return [
                "--spec-type",
                "ngram-simple",
                "--spec-ngram-simple-size-n",
                str(LOOKUP_NGRAM),
                "--spec-ngram-simple-size-m",
                str(self.tokens),
            ]
        if self.draft_model is None:
            raise ConfigError("llama.cpp's draft-model speculation needs a GGUF draft model")
        return [
            "--spec-type",
            "draft-simple",
            "--spec-draft-model",
            str(self.draft_model),
            "--spec-draft-n-max",
            str(self.tokens),
            "--spec-draft-threads",
            str(threads),
            "--spec-draft-threads-batch",
            str(threads),
        ]


def server_command(
    binary: Path,
    model: Path,
    threads: int,
    port: int,
    speculation: Speculation | None = None,
    no_webui: tuple[str, ...] = ("--no-webui",),
) -> list[str]:
    """llama-server on one GGUF file: CPU threads for decode and prefill alike, one slot, loopback only, no web UI
    (`no_webui`: how this peer's server spells it)."""
    command = [str(binary), "--model", str(model), "--threads", str(threads), "--threads-batch", str(threads)]
    command += ["--ctx-size", str(CONTEXT_TOKENS), "--parallel", "1", "--host", "127.0.0.1", "--port", str(port)]
    command += list(no_webui)
    if speculation is not None:
        command += speculation.args(threads)
    return command


def completion_body(prompt_ids: list[int], max_new_tokens: int) -> dict:
    """One /completion request: these prompt ids as they are (no template, no BOS added), greedy, nothing reused
    from an earlier request (the prefill is timed too), and the generated ids returned. It stops, as our modes do,
    after an end-of-generation token (which is returned and counts) or max_new_tokens."""
    return {
        "prompt": list(prompt_ids),
        "n_predict": max_new_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "cache_prompt": False,
        "ignore_eos": False,
        "return_tokens": True,
        "stream": False,
    }


@dataclass(frozen=True)
class Completion:
    """One answer: its ids (None from a server that returns only text), our end-to-end times (wall, and the server's
    CPU time meanwhile), llama.cpp's own timings (prompt_n, prompt_per_second, predicted_n, predicted_per_second,
    draft_n, draft_n_accepted, ...), why it stopped, and its text."""

    token_ids: list[int] | None
    seconds: float
    cpu_seconds: float
    timings: dict = field(default_factory=dict)
    stop_type: str = ""
    text: str = ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _death_signal():
    """On Linux, a function for Popen's preexec_fn that has the child get SIGTERM when the bench's process goes
    away (prctl PR_SET_PDEATHSIG; libc is loaded here, in the parent, so the child runs no import)."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process and all its threads (Linux /proc), or None where it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LlamaServer:
    """A running llama-server; `complete` answers one prompt. Use as a context manager, or call stop()."""

    def __init__(
        self, command: list[str], port: int, ready_seconds: float = READY_SECONDS, returns_ids: bool = True
    ) -> None:
        self.command = command
        self.returns_ids = returns_ids
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.NamedTemporaryFile(prefix="localspec-llama-server-", suffix=".log", delete=False)
        self.log_path = Path(self._log.name)
        # its working folder: a server may write files there (ik_llama.cpp's llama.log), never into the user's
        self.workdir = Path(tempfile.mkdtemp(prefix="localspec-llama-server-"))
        try:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                preexec_fn=_death_signal(),
            )
        except OSError as exc:
            self._close_log()
            raise LlamaServerError(f"could not run {command[0]}: {exc}") from None
        try:
            self._wait_ready(ready_seconds)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def _failure(self, what: str) -> LlamaServerError:
        return LlamaServerError(f"llama-server {what} ({' '.join(self.command)}); its log ends:\n{self.log_tail()}")

    def _wait_ready(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise self._failure(f"exited with code {code} before it was ready")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as exc:  # 503 while the model loads
                if exc.code != 503:
                    raise self._failure(f"answered /health with HTTP {exc.code}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            time.sleep(0.05)
        raise self._failure(f"was not ready after {seconds:.0f} s")

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        """Greedy ids for one prompt, timed end to end: the request, the prefill, every token, the answer's JSON."""
        body = json.dumps(completion_body(prompt_ids, max_new_tokens)).encode()
        request = urllib.request.Request(
            self.url + "/completion", data=body, headers={"Content-Type": "application/json"}
        )
        cpu_started = process_cpu_seconds(self.process.pid)
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise self._failure(f"refused a /completion request with HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            code = self.process.poll()
            raise self._failure(f"exited with code {code}" if code is not None else f"did not answer: {exc}") from None
        seconds = time.perf_counter() - started
        cpu_ended = process_cpu_seconds(self.process.pid)
        answer = json.loads(raw)
        if not isinstance(answer, dict):
            raise self._failure(f"answered with something else than a JSON object: {raw[:300]!r}")
        ids = answer.get("tokens")
        if self.returns_ids and not isinstance(ids, list):
            raise self._failure(f"answered without token ids: {raw[:300]!r}")
        if not self.returns_ids and not isinstance(answer.get("content"), str):
            raise self._failure(f"answered without text: {raw[:300]!r}")
        cpu = cpu_ended - cpu_started if cpu_started is not None and cpu_ended is not None else seconds
        stop_type = answer.get("stop_type") or ("eos" if answer.get("stopped_eos") else "")
        return Completion(
            [int(token) for token in ids] if isinstance(ids, list) else None,
            seconds,
            cpu,
            dict(answer.get("timings") or {}),
            str(stop_type),
            str(answer.get("content") or ""),
        )

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL) and remove its log."""
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._close_log()

    def _close_log(self) -> None:
        if not self._log.closed:
            self._log.close()
        self.log_path.unlink(missing_ok=True)
        shutil.rmtree(self.workdir, ignore_errors=True)
