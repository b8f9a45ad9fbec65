"""Run every mode on every prompt, interleaved prompt by prompt (the mode order rotates), after a warm-up.

Interleaving makes the ratios between modes fair on a shared, noisy machine: a slow minute hits all modes alike.
"""

from __future__ import annotations

import copy
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

from localspec.structured.grammar import Constraint, json_schema_constraint
from localspec.verify.guarantee import guarantee_for_model

from .llama_cpp import LLAMA_MODES, llama_bench_line, peer_args, peer_bench_lines, stop_servers
from .modes import Mode, RunResult, run_mode
from .prompts import BenchPrompt
from .schema_check import is_valid

WARMUP_TOKENS = 32
# Warm-up prompts: never timed, in no prompt set. Their lengths differ (a short question, a code stub, a pasted
# text), so each mode meets the row counts and proposer shapes of short and long prompts before the timed runs.
WARMUP_MESSAGES = (
    ({"role": "user", "content": "Say hello to a new neighbour in two short sentences."},),
    (
        {
            "role": "user",
            "content": "Finish this Python function.\n\n```python\ndef count_words(text: str) -> dict[str, int]:\n"
            '    """How often each word occurs in text, ignoring case."""\n```',
        },
    ),
    (
        {
            "role": "user",
            "content": "Answer from the text: what does a list comprehension build?\n\n"
            + " ".join(
                ["A list comprehension builds a new list from an iterable, applying an expression to each item"]
                + ["and keeping the items for which an optional condition holds."] * 12
            ),
        },
    ),
)


@dataclass
class PromptRecord:
    prompt: BenchPrompt
    prompt_ids: list[int]  # chat-templated
    results: dict[str, RunResult] = field(default_factory=dict)  # mode label → result
    constraint: Optional[Constraint] = None  # a JSON-schema task's grammar (prompt.schema)

    def answer(self, session, mode: Mode, max_new_tokens: int) -> RunResult:
        """One mode's answer; a JSON-schema task's complete answer (one that ended on a stop token, not cut by
        max_new_tokens) is checked against its schema (schema_check.py)."""
        result = run_mode(session, mode, self.prompt_ids, max_new_tokens, self.constraint)
        ids = result.token_ids
        if self.prompt.schema is not None and ids and ids[-1] in session.engine.stop_token_ids:
            text = session.tokenizer.decode(ids, skip_special_tokens=True)
            result.schema_valid = is_valid(text, self.prompt.schema)
        return result


@dataclass
class BenchRun:
    model: str
    modes: list[Mode]
    records: list[PromptRecord]
    max_new_tokens: int
    notes: list[str]
    machine: dict
    guarantee: dict = field(default_factory=dict)  # Guarantee.to_dict() of the loaded compute path


def load_average() -> dict:
    """os.getloadavg() and the `uptime` line, so a report can say how busy the machine was."""
    one, five, fifteen = os.getloadavg()
    try:
        line = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        line = ""
    return {"load_1m": one, "load_5m": five, "load_15m": fifteen, "uptime": line, "time": time.strftime("%H:%M:%S")}


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="run", file=sys.stderr, dynamic_ncols=True)


VERIFY_ROWS = tuple(range(1, 10))  # T-token forwards timed for the report's per-row verify costs
# cached positions those forwards are timed on: the load-time timings' short cache, and one as long as a chat's
# prompt and answer reach (the attention over it is the part of a row's cost that grows with the answer)
VERIFY_CONTEXTS = (64, 512)


def verify_costs(session) -> dict[int, dict[str, float]]:
    """Median ms of a T-token target forward, T = 1..9 (models/dtype_choice.time_forwards), on each cache length of
    VERIFY_CONTEXTS ({64: {"1": ms, …}, 512: …}), in the setup the session's engine runs its target in (the exact
    one on the default entry)."""
    from localspec.models.dtype_choice import time_forwards

    setups = {"target": session.engine.target.setup}
    costs = {}
    for context in VERIFY_CONTEXTS:
        timed = time_forwards({"target": session.loaded.target}, VERIFY_ROWS, setups, context=context)
        costs[context] = {str(t): s * 1e3 for t, s in timed.get("target", {}).items()}
    return costs


def run_bench(
    session,
    prompts: list[BenchPrompt],
    modes: list[Mode],
    max_new_tokens: int,
    notes: Optional[list[str]] = None,
    progress: bool = True,
    warmup: bool = True,
    on_result: Optional[Callable[[PromptRecord, Mode, RunResult], None]] = None,
    measure_rows: bool = True,
) -> BenchRun:
    machine = machine_info()
    machine["load_before"] = load_average()
    dtype = session.loaded.dtype
    machine["dtype"] = (
        dtype.to_dict()
        if dtype is not None
        else {"dtype": session.loaded.spec.target.dtype, "text": session.loaded.spec.target.dtype}
    )
    plan = getattr(session.engine.target, "plan", None)  # a stand-in target has none
    machine["plan"] = plan.to_dict() if plan is not None else None  # the target's forward plan, each choice and why
    costs = verify_costs(session) if measure_rows else {}
    short, long = VERIFY_CONTEXTS
    machine["verify_ms"] = costs.get(short, {})  # on the short cache: what the bytes-read bound and peers compare
    machine["verify_ms_long"] = {"context": long, "ms": costs[long]} if costs.get(long) else None
    if measure_rows:
        from .costs import forward_bound

        machine["bound"] = forward_bound(session.loaded.target)
    if any(mode.name in LLAMA_MODES for mode in modes):  # llama.cpp's own pp512 / tg128 on the file, for the report
        machine["llama_bench"] = llama_bench_line(session.loaded.spec, torch.get_num_threads())
        machine["peer_benches"] = peer_bench_lines(session.loaded.spec, torch.get_num_threads())
        machine["peer_server_args"] = peer_args()
    encoded = []
    for prompt in prompts:
        ids, _notice = session.prompt_ids(list(prompt.messages), max_new_tokens)
        schema = prompt.schema
        constraint = json_schema_constraint(schema, prompt.prompt_id) if schema is not None else None
        encoded.append(PromptRecord(prompt, ids, constraint=constraint))
    if any(r.constraint is not None for r in encoded):
        session.grammars.get()  # the tokenizer's grammar form, made once per model: not in the first answer's time
    # Each mode keeps its own adaptive controllers, started from the state a user's first answer meets (the costs
    # timed at load, nothing learnt yet), so no mode starts a prompt with another mode's acceptance on it.
    engine = session.engine
    loaded_state = engine.controllers
    fresh = copy.deepcopy(loaded_state)
    per_mode = {mode.label: copy.deepcopy(fresh) for mode in modes}
    try:
        if warmup:  # first calls pay for lazy initialisation (kernels, allocator, caches): keep them out of the numbers
            for messages in WARMUP_MESSAGES:
                ids, _notice = session.prompt_ids(list(messages), WARMUP_TOKENS)
                for mode in modes:
                    engine.controllers = copy.deepcopy(fresh)  # what the warm-up learns is thrown away
                    run_mode(session, mode, ids, min(WARMUP_TOKENS, max_new_tokens))
        bar = _progress_bar(len(prompts) * len(modes), progress)
        samples = []
        for index, record in enumerate(encoded):
            shift = index % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                engine.controllers = per_mode[mode.label]
                result = record.answer(session, mode, max_new_tokens)
                record.results[mode.label] = result
                if on_result is not None:
                    on_result(record, mode, result)
                if bar is not None:
                    bar.set_postfix_str(
                        f"{record.prompt.prompt_id} {mode.label}: "
                        f"{result.new_tokens / max(result.seconds, 1e-9):.1f} tok/s"
                    )
                    bar.update(1)
            samples.append(os.getloadavg()[0])
    finally:
        engine.controllers = loaded_state
        stop_servers()  # the llama.cpp modes' servers end with the run, error or Ctrl-C included
    if bar is not None:
        bar.close()
    machine["load_after"] = load_average()
    machine["load_1m_during"] = {"min": min(samples), "max": max(samples), "mean": sum(samples) / len(samples)}
    loaded = session.loaded
    guarantee = guarantee_for_model(loaded.target, loaded.quant, loaded.device.type, loaded.exact_on).to_dict()
    return BenchRun(loaded.spec.name, modes, encoded, max_new_tokens, list(notes or []), machine, guarantee)
