"""Training prompts for distillation: the shared prompt sets minus the held-out evaluation prompts, plus prompts
made from text that ships offline (Python's standard library sources and docstrings) and simple topic templates."""

from __future__ import annotations

import ast
import gzip
import json
import random
import sysconfig
from pathlib import Path

from localspec.config import ConfigError

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
# Essay questions on the humanities and social sciences: the shared prompt sets have none outside the held-out
# MT-Bench ids (its whole "humanities" category is 151-160), and without them the trained head had seen almost no
# long-form prose of this kind (held-out acceptance there was a third of that on code).
ESSAY_TOPICS = (
    "the Industrial Revolution",
    "supply and demand",
    "the separation of powers",
    "existentialism",
    "minimum wage laws",
    "the Cold War",
    "utilitarianism",
    "urbanization",
    "the Silk Road",
    "opera",
    "impressionist painting",
    "stoicism",
    "central banks",
    "trade tariffs",
    "the scientific method",
    "human rights",
    "colonialism",
    "the Enlightenment",
    "jazz",
    "propaganda",
    "the welfare state",
    "globalization",
    "public libraries",
    "the Olympic Games",
    "free speech",
    "endangered languages",
    "Gothic cathedrals",
    "Greek mythology",
    "the gig economy",
    "taxation",
    "aging and memory",
    "the ethics of zoos",
    "classical music",
    "the Great Depression",
    "folk tales",
    "diplomacy",
    "poverty",
    "photography as an art form",
    "the role of religion in society",
    "nationalism",
    "universal basic income",
    "the history of medicine",
    "philosophy of mind",
    "consumer culture",
    "migration",
    "the printing of money",
)
ESSAY_TEMPLATES = (
    "Discuss the impact of {t} on modern society.",
    "Explain the main ideas behind {t}, with examples.",
    "Compare two different perspectives on {t}.",
    "What lessons can we learn from {t}?",
    "Describe the history of {t} in a few paragraphs.",
    "Write a lesson plan for teaching {t} to teenagers.",
    "What are common misconceptions about {t}? Explain why they are wrong.",
    "Give three arguments for and three against {t}.",
)
# Advice, guides and explanations: the held-out chat prompts ask for lists, plans, principles with examples
# and recommendations, a shape the topic and essay templates above cover thinly. New topics only (none above, none
# in the held-out questions).
GUIDE_TOPICS = (
    "public speaking",
    "personal budgeting",
    "negotiating a salary",
    "starting a small business",
    "customer service",
    "project management",
    "writing a cover letter",
    "team leadership",
    "marketing on social media",
    "brand design",
    "pricing a product",
    "supply chains",
    "water conservation",
    "composting",
    "bird watching",
    "amateur astronomy",
    "film editing",
    "modern architecture",
    "Renaissance painting",
    "abstract art",
    "sculpture",
    "pottery",
    "calligraphy",
    "writing poetry",
    "writing short stories",
    "journalism",
    "fact-checking",
    "museum curation",
    "archaeology",
    "ancient Egypt",
    "the Roman Republic",
    "the Industrial Age in cities",
    "the civil rights movement",
    "world religions",
    "Norse mythology",
    "medical ethics",
    "animal welfare",
    "international trade",
    "cryptocurrency",
    "microfinance",
    "behavioral economics",
    "consumer psychology",
    "child development",
    "adolescence",
    "memory and learning",
    "stress management",
    "mindfulness",
    "nutrition",
    "home cooking",
    "baking bread",
    "vegetarian diets",
    "running a first marathon",
    "yoga",
    "team sports",
    "board game design",
    "video game design",
    "virtual reality",
    "online privacy",
    "password security",
    "homeschooling",
    "online courses",
    "study habits",
    "exam preparation",
    "critical thinking",
    "debating",
    "volunteering",
    "community organizing",
    "urban planning",
    "cycling in cities",
    "tourism",
    "travelling on a budget",
    "camping",
    "hiking safety",
    "first aid",
    "disaster preparedness",
    "climate adaptation",
    "ocean conservation",
    "coral reefs",
    "rainforests",
    "deserts",
    "earthquakes",
    "weather forecasting",
    "antibiotics",
    "genetics",
    "the immune system",
    "space exploration",
    "missions to Mars",
    "3D printing",
    "smart homes",
    "parenting teenagers",
    "caring for elderly parents",
    "adopting a pet",
    "dog training",
    "conflict resolution",
    "cultural festivals",
    "wedding traditions",
    "the history of fashion",
    "interior design",
    "minimalism",
    "gardening with children",
    "moving to a new city",
    "learning to play the guitar",
    "choir singing",
    "theatre lighting",
    "radio broadcasting",
    "podcasting",
    "note-taking",
    "scientific writing",
    "translation between languages",
    "sign language",
    "mentoring",
    "remote teams",
    "workplace safety",
    "job burnout",
    "retirement planning",
    "buying a first home",
    "renting an apartment",
    "car maintenance",
    "electric bicycles",
    "solar panels at home",
    "food waste",
    "local farmers' markets",
    "coffee roasting",
    "tea culture",
    "wine regions",
    "street food",
    "knitting",
)
GUIDE_TEMPLATES = (
    "List five practical tips for {t}, with one sentence on each.",
    "Explain {t} to someone who has never heard of it.",
    "What are the main benefits and drawbacks of {t}?",
    "Suggest a step-by-step plan for getting started with {t}.",
    "Describe three key principles of {t} and give an example of each.",
    "Write a short beginner's guide to {t}.",
    "How has {t} changed over the last fifty years?",
    "Recommend four books or resources for learning about {t}, with a brief note on each.",
    "Give a brief overview of {t} and why it matters.",
    "What mistakes do beginners often make with {t}?",
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
    families = ((TOPICS, TEMPLATES), (ESSAY_TOPICS, ESSAY_TEMPLATES), (GUIDE_TOPICS, GUIDE_TEMPLATES))
    prompts = [template.format(t=topic) for topics, templates in families for topic in topics for template in templates]
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
    data_dir: Path = SHARED_DATA, extra_files: tuple = (), stdlib_limit: int = 400, seed: int = 0
) -> list[str]:
    """All training prompts, interleaved so any prefix of the list is a mix of every source."""
    sources = []
    if data_dir is not None and (Path(data_dir) / "mt_bench_question.jsonl").exists():
        sources.append(read_mt_bench(Path(data_dir) / "mt_bench_question.jsonl", False))
        sources.append(read_humaneval(Path(data_dir) / "HumanEval.jsonl.gz", False))
    for path in extra_files:
        sources.append(prompt_file(path))
    if stdlib_limit:
        sources.append(stdlib_prompts(stdlib_limit, seed))
        sources.append(template_prompts(seed))
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
