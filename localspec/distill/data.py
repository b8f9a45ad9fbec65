"""Training prompts for distillation: the shared prompt sets minus MT-Bench's and HumanEval's held-out ids, prompts
made from text that ships offline (Python's standard library sources and docstrings), simple topic templates, and
the task types of a chat app (tasks.py). None of them is read from, or shaped after, the evaluation prompt set."""

from __future__ import annotations

import ast
import gzip
import json
import random
import sysconfig
from pathlib import Path

from localspec.config import ConfigError

from .tasks import Prompt, task_prompts

HELD_OUT_MT_BENCH = frozenset(range(151, 161))  # MT-Bench question ids kept for evaluation
HELD_OUT_HUMANEVAL = frozenset(range(150, 164))  # HumanEval task numbers kept for evaluation
CODE_PREFIX = "Complete this Python function:\n"
SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

STDLIB_MODULES = (
    "json",
    "os",
    "re",
    "string",
    "textwrap",
    "csv",
    "heapq",
    "bisect",
    "statistics",
    "random",
    "fractions",
    "functools",
    "itertools",
    "collections",
    "pathlib",
    "shutil",
    "calendar",
    "datetime",
    "difflib",
    "fnmatch",
    "glob",
    "hashlib",
    "base64",
    "html",
    "ipaddress",
    "colorsys",
    "copy",
    "pprint",
    "shlex",
    "tempfile",
    "zipfile",
    "tarfile",
    "gzip",
    "argparse",
    "logging",
    "configparser",
    "urllib/parse",
    "email/utils",
    "http/cookies",
    "uuid",
    "secrets",
    "decimal",
    "graphlib",
    "dataclasses",
    "enum",
    "inspect",
    "ast",
    "tokenize",
    "operator",
    "contextlib",
    "threading",
    "queue",
    "sched",
    "selectors",
    "subprocess",
    "platform",
    "locale",
    "gettext",
    "mimetypes",
    "wave",
    "plistlib",
    "netrc",
    "quopri",
    "codecs",
    "unicodedata",
    "stringprep",
    "typing",
    "weakref",
    "abc",
    "numbers",
    "cmath",
    "math",
    "array",
    "struct",
    "timeit",
    "trace",
    "pdb",
)
TOPICS = (
    "renewable energy",
    "learning a new language",
    "remote work",
    "healthy sleep",
    "the history of the printing press",
    "machine learning",
    "climate change",
    "personal finance",
    "public transport",
    "urban gardening",
    "volcanoes",
    "the French Revolution",
    "photosynthesis",
    "black holes",
    "a job interview",
    "time management",
    "chess",
    "the water cycle",
    "electric cars",
    "social media",
    "ancient Rome",
    "quantum computing",
    "coffee",
    "meditation",
    "recycling",
    "the stock market",
    "vaccines",
    "a trip to Japan",
    "a small bakery",
    "video games",
    "the Moon landing",
    "honeybees",
    "cybersecurity",
    "a marathon",
    "friendship",
    "a rainy day",
    "the Internet",
    "democracy",
    "the human heart",
    "plate tectonics",
    "inflation",
    "a startup company",
    "open source software",
    "the ocean",
    "artificial intelligence ethics",
    "a museum visit",
    "electricity",
    "cooking pasta",
    "the Renaissance",
    "a customer complaint",
    "prime numbers",
    "probability",
    "a school play",
    "mountain hiking",
    "DNA",
)
TEMPLATES = (
    "Write a short blog post about {t}.",
    "Explain {t} to a high school student.",
    "What are the pros and cons of {t}?",
    "Write a short poem about {t}.",
    "Give me five tips related to {t}.",
    "Summarize the most important facts about {t} in a few bullet points.",
    "Pretend you are an expert on {t}. Answer: what do most people get wrong about it?",
    "Write a professional email to a colleague about {t}.",
    "Compose a short story that involves {t}.",
    "Create a multiple-choice quiz with three questions about {t}.",
)
MATH_TEMPLATES = (
    "What is {a} times {b}? Show your steps.",
    "Solve for x: {a}x + {b} = {c}.",
    "A shop sells pens at {a} dollars each. How much do {b} pens cost, and how much change is left from {c} dollars?",
    "What is the sum of the integers from 1 to {a}?",
    "Is {c} a prime number? Explain.",
)


def read_mt_bench(path: Path, held_out: bool) -> list[str]:
    """Every turn of the MT-Bench questions (as single-turn prompts); held_out picks the evaluation ids instead."""
    prompts = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if (row["question_id"] in HELD_OUT_MT_BENCH) == held_out:
                prompts.extend(row["turns"][:1] if held_out else row["turns"])
    return prompts


def read_humaneval(path: Path, held_out: bool) -> list[str]:
    prompts = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            number = int(row["task_id"].split("/")[-1])
            if (number in HELD_OUT_HUMANEVAL) == held_out:
                prompts.append(CODE_PREFIX + row["prompt"])
    return prompts


def held_out_prompts(data_dir: Path = SHARED_DATA) -> list[str]:
    """The evaluation prompts: MT-Bench 151–160 (first turns) and HumanEval 150–163. Never trained on."""
    _check(data_dir)
    return read_mt_bench(data_dir / "mt_bench_question.jsonl", True) + read_humaneval(
        data_dir / "HumanEval.jsonl.gz", True
    )


def stdlib_prompts(limit: int, seed: int = 0) -> list[str]:
    """HumanEval-style completions (a stdlib function's signature and docstring) and 'explain' questions."""
    root = Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for name in STDLIB_MODULES:
        path = root / f"{name}.py"
        if not path.exists():
            path = root / name / "__init__.py"
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        module = name.replace("/", ".")
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40:
                continue
            node.body = [ast.Expr(ast.Constant(doc[:800]))]
            node.decorator_list = []
            prompts.append(CODE_PREFIX + ast.unparse(node) + "\n")
            prompts.append(f"Explain what the Python function `{module}.{node.name}` does, with a short example.")
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


def template_prompts(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prompts = [template.format(t=topic) for topic in TOPICS for template in TEMPLATES]
    for template in MATH_TEMPLATES:
        for _ in range(12):
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            prompts.append(template.format(a=a, b=b, c=a * b + rng.randint(1, 50)))
    rng.shuffle(prompts)
    return prompts


def prompt_file(path: Path) -> list[str]:
    """A user prompt file: .jsonl (fields 'prompt', 'text' or 'turns') or plain text, one prompt per line."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"prompt file {path} not found")
    prompts = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            if path.name.endswith((".jsonl", ".jsonl.gz")):
                row = json.loads(line)
                prompts.extend(row["turns"] if "turns" in row else [row.get("prompt") or row.get("text") or ""])
            else:
                prompts.append(line)
    return [p for p in prompts if p.strip()]


def training_prompts(
    data_dir: Path = SHARED_DATA,
    extra_files: tuple = (),
    stdlib_limit: int = 400,
    seed: int = 0,
    per_task_type: int = 150,
) -> list[Prompt]:
    """All training prompts, interleaved so any prefix of the list is a mix of every source: each task type of
    tasks.py is a source of its own, beside MT-Bench, HumanEval, the stdlib functions and the topic templates."""
    sources = []
    if data_dir is not None and (Path(data_dir) / "mt_bench_question.jsonl").exists():
        sources.append(read_mt_bench(Path(data_dir) / "mt_bench_question.jsonl", False))
        sources.append(read_humaneval(Path(data_dir) / "HumanEval.jsonl.gz", False))
    for path in extra_files:
        sources.append(prompt_file(path))
    if stdlib_limit:
        sources.append(stdlib_prompts(stdlib_limit, seed))
        sources.append(template_prompts(seed))
    if per_task_type:
        sources.extend(task_prompts(per_task_type, data_dir, seed).values())
    held = set(held_out_prompts(data_dir)) if data_dir is not None and Path(data_dir).exists() else set()
    rng = random.Random(seed)
    for source in sources:
        rng.shuffle(source)
    mixed, seen = [], set()
    for i in range(max((len(s) for s in sources), default=0)):
        for source in sources:
            if i < len(source) and source[i] not in held and source[i] not in seen:
                seen.add(source[i])
                mixed.append(source[i])
    return mixed


def _check(data_dir: Path) -> None:
    if not (Path(data_dir) / "mt_bench_question.jsonl").exists():
        raise ConfigError(f"shared prompt data not found in {data_dir} (expected mt_bench_question.jsonl)")
