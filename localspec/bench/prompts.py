"""Benchmark prompts: MT-Bench first turns and HumanEval function stubs (../shared/data), the JSON-schema task
(data/json_schema.jsonl, shipped: `--prompts json-schema`; data/json_schema_held_out.jsonl: `--prompts
json-schema-held-out`), or the user's own files."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from localspec.config import ConfigError, Environment

MT_BENCH_FILE = "mt_bench_question.jsonl"
HUMANEVAL_FILE = "HumanEval.jsonl.gz"
# a --prompts name → its file. json-schema's five prompts shaped the grammar-guided drafts (proposers/grammar.py):
# they are its tuning set; json-schema-held-out's twelve were written before anything was measured on them
BUILTIN_SETS = {
    "json-schema": Path(__file__).with_name("data") / "json_schema.jsonl",
    "json-schema-held-out": Path(__file__).with_name("data") / "json_schema_held_out.jsonl",
}
CODE_INSTRUCTION = "Complete this Python function. Reply with the whole function in one code block.\n\n"


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark question, as chat messages; category groups the table rows (the prompt set's name)."""

    prompt_id: str
    category: str  # 'mt-bench' | 'humaneval' | the stem of a --prompts file
    messages: tuple[dict, ...]
    subcategory: str = ""  # MT-Bench's own category (writing, coding, …) when known
    schema: dict | None = None  # a JSON-schema task: the answer is constrained to it, then checked against it


def default_data_dir() -> Path:
    """$LOCALSPEC_BENCH_DATA, else ../shared/data next to the repository, else /work/shared/data."""
    candidates = [
        Environment.read().bench_data,
        Path(__file__).resolve().parents[3] / "shared" / "data",
        "/work/shared/data",
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / MT_BENCH_FILE).exists():
            return Path(candidate)
    raise ConfigError(
        "benchmark prompts not found: expected ../shared/data/mt_bench_question.jsonl next to the "
        "repository; pass --prompts FILE or set LOCALSPEC_BENCH_DATA"
    )


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ConfigError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read prompt file {path}: {exc.strerror or exc}") from None
    return rows


def _spread(rows: list[BenchPrompt], limit: int | None) -> list[BenchPrompt]:
    """Take `limit` prompts round-robin over subcategories, so a small limit still covers every kind of question."""
    if limit is None or limit >= len(rows):
        return rows
    groups: dict[str, list[BenchPrompt]] = {}
    for row in rows:
        groups.setdefault(row.subcategory, []).append(row)
    picked: list[BenchPrompt] = []
    depth = 0
    while len(picked) < limit:
        for group in groups.values():
            if depth < len(group) and len(picked) < limit:
                picked.append(group[depth])
        depth += 1
    return picked


def load_mt_bench(path: Path, limit: int | None = None) -> list[BenchPrompt]:
    rows = [
        BenchPrompt(
            f"mt-bench/{row.get('question_id', i)}",
            "mt-bench",
            ({"role": "user", "content": row["turns"][0]},),
            row.get("category", ""),
        )
        for i, row in enumerate(_read_jsonl(path))
    ]
    return _spread(rows, limit)


def load_humaneval(path: Path, limit: int | None = None) -> list[BenchPrompt]:
    rows = [
        BenchPrompt(
            str(row.get("task_id", f"humaneval/{i}")).lower(),
            "humaneval",
            ({"role": "user", "content": CODE_INSTRUCTION + "```python\n" + row["prompt"] + "```"},),
        )
        for i, row in enumerate(_read_jsonl(path))
    ]
    return rows[:limit] if limit is not None else rows


def load_prompt_file(path: Path, limit: int | None = None) -> list[BenchPrompt]:
    """A .jsonl(.gz) with one of turns / prompt / text / messages per line (and optionally a JSON schema the answer
    follows, "schema"), or a .txt with one prompt per line; or the name of a shipped set (BUILTIN_SETS)."""
    path = BUILTIN_SETS.get(str(path), Path(path))
    if not path.exists():
        raise ConfigError(f"prompt file {path} not found")
    name = path.name.split(".")[0]
    if path.name == MT_BENCH_FILE:
        return load_mt_bench(path, limit)
    if path.name == HUMANEVAL_FILE:
        return load_humaneval(path, limit)
    prompts = []
    if path.suffix == ".txt":
        lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
        raw = [{"prompt": line} for line in lines if line]
    else:
        raw = _read_jsonl(path)
    for i, row in enumerate(raw):
        if "messages" in row:
            messages = tuple({"role": m["role"], "content": str(m["content"])} for m in row["messages"])
        else:
            text = row["turns"][0] if "turns" in row else row.get("prompt", row.get("text"))
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(f"{path}: entry {i + 1} has no 'turns', 'prompt', 'text' or 'messages'")
            messages = ({"role": "user", "content": text},)
        prompts.append(
            BenchPrompt(
                f"{name}/{row.get('id', row.get('question_id', i))}",
                name,
                messages,
                str(row.get("category", "")),
                _schema(row.get("schema"), f"{path}: entry {i + 1}'s schema"),
            )
        )
    return _spread(prompts, limit)


def _schema(value, where: str) -> dict | None:
    """A task's schema, checked by both readers: llguidance (it can constrain to it) and schema_check (the bench
    can check the answers against it)."""
    if value is None:
        return None
    from localspec.structured.grammar import json_schema_constraint

    from .schema_check import check_supported

    check_supported(value, where)
    json_schema_constraint(value, where)
    return value


def is_held_out(prompt: BenchPrompt) -> bool:
    """One of the prompts `localspec distill` never trains on (MT-Bench ids 151–160, HumanEval tasks 150–163)."""
    from localspec.distill.data import HELD_OUT_HUMANEVAL, HELD_OUT_MT_BENCH

    number = prompt.prompt_id.rsplit("/", 1)[-1]
    if not number.isdigit():
        return False
    held = HELD_OUT_MT_BENCH if prompt.category == "mt-bench" else HELD_OUT_HUMANEVAL
    return prompt.category in ("mt-bench", "humaneval") and int(number) in held


def load_prompts(files: list[str] | None = None, limit: int | None = None, held_out: bool = False) -> list[BenchPrompt]:
    """The default sets (MT-Bench, HumanEval; `limit` from each) or the given files (`limit` from each).
    held_out keeps only the default sets' prompts that distillation never trains on, so a trained head or draft
    is measured on questions it has not seen (its own answers to the others were its training data)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be ≥ 1 (got {limit})")
    if files:
        if held_out:
            raise ConfigError("--held-out picks from the default prompt sets; it does not apply to --prompts files")
        prompts = [p for f in files for p in load_prompt_file(Path(f), limit)]
    elif held_out:
        data = default_data_dir()
        prompts = [p for p in load_mt_bench(data / MT_BENCH_FILE) if is_held_out(p)][:limit] + [
            p for p in load_humaneval(data / HUMANEVAL_FILE) if is_held_out(p)
        ][:limit]
    else:
        data = default_data_dir()
        prompts = load_mt_bench(data / MT_BENCH_FILE, limit) + load_humaneval(data / HUMANEVAL_FILE, limit)
    if not prompts:
        raise ConfigError("no benchmark prompts were found in the given files")
    return prompts
