"""llama.cpp's own llama-bench on the bench's file: pp512 and tg128, the numbers a llama.cpp user would quote, run
once per bench run so every ratio against the llama.cpp modes can be checked against them."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from localspec.config import ConfigError

PROMPT_TOKENS = 512  # pp512: prefill of 512 tokens in one batch
GEN_TOKENS = 128  # tg128: 128 tokens decoded one at a time after an empty prompt
RUN_SECONDS = 600.0


@dataclass(frozen=True)
class Rate:
    tokens_per_s: float  # llama-bench's avg_ts over its repetitions
    stddev: float  # its stddev_ts


@dataclass(frozen=True)
class LlamaBench:
    """One llama-bench run: prefill (pp) and decode (tg) rates, and what they were measured on."""

    command: list[str]
    pp: Rate
    tg: Rate
    threads: int
    build_commit: str
    cpu_info: str
    flash_attn: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def bench_command(binary: Path, model: Path, threads: int) -> list[str]:
    return [
        str(binary),
        "-m",
        str(model),
        "-t",
        str(threads),
        "-p",
        str(PROMPT_TOKENS),
        "-n",
        str(GEN_TOKENS),
        "-o",
        "json",
    ]


def parse(command: list[str], text: str) -> LlamaBench:
    """llama-bench's `-o json` output (a list of tests) → the pp and tg rates, or a ConfigError naming what is off."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"llama-bench printed no JSON ({exc}): {text[-300:]!r}") from None

    def test(n_prompt: int, n_gen: int) -> dict:
        for row in tests if isinstance(tests, list) else ():
            if isinstance(row, dict) and row.get("n_prompt") == n_prompt and row.get("n_gen") == n_gen:
                return row
        raise ConfigError(f"llama-bench's output has no test with n_prompt={n_prompt}, n_gen={n_gen}")

    pp, tg = test(PROMPT_TOKENS, 0), test(0, GEN_TOKENS)
    return LlamaBench(
        command,
        Rate(float(pp["avg_ts"]), float(pp.get("stddev_ts", 0.0))),
        Rate(float(tg["avg_ts"]), float(tg.get("stddev_ts", 0.0))),
        int(tg.get("n_threads", 0)),
        str(tg.get("build_commit", "")),
        str(tg.get("cpu_info", "")),
        tg.get("flash_attn"),
    )


def run_llama_bench(binary: Path, model: Path, threads: int) -> LlamaBench:
    command = bench_command(binary, model, threads)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_SECONDS, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"llama-bench did not run ({' '.join(command)}): {exc}") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise ConfigError(f"llama-bench exited with code {done.returncode} ({' '.join(command)}):\n{tail}")
    return parse(command, done.stdout)
