"""Measure, per compute path and forward setup, whether a row computed inside a multi-row forward (a chain verify of R
rows, a token tree) has the same logits as the same row computed by plain decoding (1 token per forward), over
prompts the tests never use (gsm8k train questions, and MT-Bench / HumanEval items past the ones tests read).

For each prompt the target decodes NEW_TOKENS greedy tokens one forward per token (the engine's plain path: the
prompt minus its last token prefilled, then 1-token forwards). The same sequence is then fed again on a fresh cache
  - in chunks of R tokens, R = 2..17 (a verify forward with every draft accepted, so each row has the same prefix as
    the plain row it is compared with, and the cache is built by chunk forwards as in a speculative run);
  - as token trees: the pending token and D path nodes, each path node preceded by a sibling holding another token
    (2D + 1 rows under the tree mask, tree positions; keep_path then compacts the cache to the path), D = 3 and 8.
Per path and setup it reports the largest |Δlogit|, the positions whose logits are not bitwise equal, the argmax
flips, and the largest top-2 gap (on the plain logits) among the flips.

Forward setups (localspec/runtime/model_runner.py ForwardSetup):
  fast        sdpa, transformers' own mask, 1-row decode forwards (transformers' defaults)
  eager-mask  eager attention with the explicit additive mask, 1-row decode forwards
  eager-mask-2  the same, and every forward at least 2 rows (a dummy row after a single token, its cache row dropped)
  eager-mask-4x4  the same, every forward padded to a multiple of 4 rows
  exact       model_runner.exact_setup: eager-mask with EXACT_ROWS dummy rows (at least 2; multiples of 8 in float32)
  exact-rows  model_runner.exact_rows_setup: exact, and each decode / verify row's attention in plain shapes (lean)
  eager-mask-rows  eager-mask with each decode / verify row's attention in plain shapes (lean), 1-row decode
  engine      model_runner.exact_setup_for(the target): what the engine's exact forwards run (decode / verify
              attention on the attention kernel wherever the kernels' library loads: the loader attaches it to
              every CPU target; on the q4 kernel also 1-row decode)

Run: localspec bench rounding [--paths float32 bfloat16 ...] [--setups fast exact ...] [--json-dir DIR]
A file written to assets/rounding/<machine>/ states a guarantee once assets/rounding/index.json names it
(localspec/measured.py reads the figures at import).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from localspec.measured import Tally

from .interleave import table
from .prompts import default_data_dir

MODELS_YAML = Path(__file__).resolve().parents[2] / "models.yaml"

CHUNKS = tuple(range(2, 18))  # R = K + 1 for K = 1..16
TREE_DEPTHS = (3, 8)  # 2D + 1 = 7 and 17 rows
MT_BENCH_FIRST = 20  # tests read MT-Bench items 0..5 and HumanEval items 0..3 (tests/conftest.py shared_prompts)
HUMANEVAL_FIRST = 20
GSM8K_FIRST = 100
THREADS = 2  # what the app and the tests run with on the 2-core CI machine
PATHS = {
    "float32": ("float32", "none"),
    "bfloat16": ("bfloat16", "none"),
    "float16": ("float16", "none"),
    "nf4": ("float32", "nf4"),
    "int8": ("float32", "int8"),
    "gguf": ("bfloat16", "gguf"),  # the GGUF's Q4_1 blocks as int4 linears (models/gguf_linear.py)
}


def setups(dtype: torch.dtype) -> dict:
    from localspec.runtime.model_runner import FAST, ForwardSetup, exact_rows_setup, exact_setup

    eager_mask = ForwardSetup(attention="eager", explicit_mask=True, min_rows=1)
    return {
        "fast": FAST,
        "eager-mask": eager_mask,
        "eager-mask-2": ForwardSetup(attention="eager", explicit_mask=True, min_rows=2),
        "eager-mask-4x4": ForwardSetup(attention="eager", explicit_mask=True, min_rows=4, row_multiple=4),
        "exact": exact_setup(dtype),
        "exact-rows": exact_rows_setup(dtype),
        "eager-mask-rows": dataclasses.replace(eager_mask, rows_as_plain=True),
    }


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or platform.machine()
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
        platform.machine(),
    )


def unseen_prompts(gsm8k: int, mt_bench: int, humaneval: int) -> list[str]:
    """Prompts no test reads: gsm8k train questions from GSM8K_FIRST, MT-Bench / HumanEval items from *_FIRST."""
    data = default_data_dir()
    prompts = []
    with open(data / "gsm8k_train_400.jsonl") as fh:
        lines = fh.readlines()[GSM8K_FIRST : GSM8K_FIRST + gsm8k]
    prompts += [json.loads(line)["question"] for line in lines]
    with open(data / "mt_bench_question.jsonl") as fh:
        lines = fh.readlines()[MT_BENCH_FIRST : MT_BENCH_FIRST + mt_bench]
    prompts += [json.loads(line)["turns"][0] for line in lines]
    with gzip.open(data / "HumanEval.jsonl.gz", "rt") as fh:
        lines = fh.readlines()[HUMANEVAL_FIRST : HUMANEVAL_FIRST + humaneval]
    prompts += ["Complete this Python function:\n" + json.loads(line)["prompt"] for line in lines]
    return prompts


def top2_gap(logits: torch.Tensor) -> float:
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def plain_logits(runner, prompt_ids: list[int], new_tokens: int, stop: set[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy decode with 1-token forwards; return (the fed sequence [prompt[-1]] + answer, logits [T, V])."""
    runner.reset()
    runner.extend(prompt_ids[:-1], logits_to_keep=0)
    fed, rows = [prompt_ids[-1]], []
    for _ in range(new_tokens):
        logits = runner.extend([fed[-1]]).logits[-1].float()
        rows.append(logits)
        token = int(torch.argmax(logits))
        if token in stop:
            break
        fed.append(token)
    return fed[: len(rows)], torch.stack(rows)


def back_to_prompt(runner, prompt_ids: list[int]) -> None:
    """The cache holding the prompt but its last token: cropped back to it when it is there (the prefix rows are
    the prefill's either way), else a fresh prefill."""
    if runner.tokens[: len(prompt_ids) - 1] == prompt_ids[:-1]:
        runner.crop(len(prompt_ids) - 1)
        return
    runner.reset()
    runner.extend(prompt_ids[:-1], logits_to_keep=0)


def chunked_logits(runner, prompt_ids: list[int], fed: list[int], chunk: int) -> torch.Tensor:
    back_to_prompt(runner, prompt_ids)
    rows = [runner.extend(fed[i : i + chunk]).logits.float() for i in range(0, len(fed), chunk)]
    return torch.cat(rows)


def tree_logits(runner, prompt_ids: list[int], fed: list[int], depth: int, vocab: int) -> torch.Tensor:
    """fed as token trees: each step the pending token and `depth` path nodes, a sibling (another token) before each."""
    from localspec.runtime.tree import TokenTree

    back_to_prompt(runner, prompt_ids)
    rows, i = [], 0
    while i < len(fed):
        path = fed[i + 1 : i + 1 + depth]
        tokens, parents, path_rows, parent = [], [], [], -1
        for token in path:
            tokens += [(token + 1) % vocab, token]
            parents += [parent, parent]
            parent = len(tokens) - 1
            path_rows.append(len(tokens))  # node index len-1, row len
        prefix_len = len(runner.tokens)
        forward = runner.extend_tree(fed[i], TokenTree(tokens, parents))
        keep = [0] + path_rows
        rows.append(forward.logits[keep].float())
        runner.keep_path(prefix_len, keep)
        i += len(path) + 1
    return torch.cat(rows)[: len(fed)]


def tally(got: torch.Tensor, plain: torch.Tensor, gaps: list[float]) -> Tally:
    """Rows got [T, V] against plain decoding's rows [T, V] (gaps: plain decoding's top-2 gap per row)."""
    flipped = (got.argmax(-1) != plain.argmax(-1)).nonzero().flatten().tolist()
    return Tally(
        len(plain),
        int((got != plain).any(-1).sum()),
        float((got - plain).abs().max()),
        len(flipped),
        max([0.0] + [gaps[j] for j in flipped]),
    )


def session_for(name: str):
    """A chat session on the embedded model loaded on compute path `name` (PATHS), without its draft."""
    from localspec.chat import ChatSession
    from localspec.config import ModelSpec
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    dtype, quant = PATHS[name]
    pair = load_registry(MODELS_YAML)[0]
    target = ModelSpec(pair.target.source, quant, dtype, pair.target.trust_remote_code)
    return ChatSession(load_pair(dataclasses.replace(pair, target=target), device="cpu", load_draft=False))


def measure_path(name: str, prompts: list[str], setup_names: list[str], new_tokens: int) -> dict:
    from localspec.runtime.model_runner import ModelRunner, exact_setup_for

    dtype, quant = PATHS[name]
    session = session_for(name)
    stop = set(session.engine.stop_token_ids)
    prompt_ids = [session.prompt_ids([{"role": "user", "content": t}], new_tokens)[0] for t in prompts]
    result = {"path": name, "dtype": dtype, "quant": quant, "prompts": len(prompts), "setups": {}}
    for setup_name in setup_names:
        started = time.perf_counter()
        setup = (
            exact_setup_for(session.loaded.target)
            if setup_name == "engine"
            else setups(session.loaded.target.dtype)[setup_name]
        )
        runner = ModelRunner(session.loaded.target, compile="off", setup=setup)
        chains: dict[int, Tally] = {r: Tally() for r in CHUNKS}
        trees: dict[int, Tally] = {d: Tally() for d in TREE_DEPTHS}
        min_gap = float("inf")
        for ids in prompt_ids:
            fed, plain = plain_logits(runner, ids, new_tokens, stop)
            gaps = [top2_gap(row) for row in plain]
            min_gap = min(min_gap, *gaps)
            for r in CHUNKS:
                chains[r] += tally(chunked_logits(runner, ids, fed, r), plain, gaps)
            if runner.supports_tree:
                for d in TREE_DEPTHS:
                    trees[d] += tally(tree_logits(runner, ids, fed, d, runner.vocab_size), plain, gaps)
        every = Tally.pooled([*chains.values(), *trees.values()])
        result["setups"][setup_name] = {
            **dataclasses.asdict(every),
            "smallest_top2_gap": min_gap,
            "chains": {r: dataclasses.asdict(t) for r, t in chains.items()},
            "trees": {2 * d + 1: dataclasses.asdict(t) for d, t in trees.items()},
            "seconds": time.perf_counter() - started,
        }
    return result


def measure(
    paths: list[str],
    setup_names: list[str],
    prompts: list[str],
    new_tokens: int,
    json_dir: Path | None = None,
    print_row=print,
) -> str:
    """Measure each path in each setup; print a table row per (path, setup) as it lands, write <path>.json per path
    into json_dir, and return the table."""
    import transformers

    machine = (
        f"{cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"transformers {transformers.__version__}"
    )
    print_row(
        f"# rounding: 1-token forwards vs chains of R = 2..17 rows and trees of 7 / 17 rows, {len(prompts)} prompts "
        f"no test reads × {new_tokens} tokens, SmolLM2-135M-Instruct on CPU ({machine})"
    )
    header = ["path", "setup", "positions not bitwise equal", "max abs logit diff", "flips", "largest flip gap"]
    rows = []
    for name in paths:
        try:
            result = measure_path(name, prompts, setup_names, new_tokens)
        except Exception as exc:  # one path that does not run here must not hide the others
            result = {"path": name, "error": f"{type(exc).__name__}: {exc}"}
            rows.append([name, "", f"does not run: {result['error'][:80]}", "", "", ""])
            print_row(f"{name}: does not run: {result['error']}")
        else:
            for setup_name, s in result["setups"].items():
                rows.append([name, setup_name, f"{s['unequal']} / {s['positions']}", f"{s['max_abs_diff']:.3g}",
                             s["flips"], f"{s['max_flip_gap']:.3g}"])  # fmt: skip
                print_row(" | ".join(map(str, rows[-1])))
        if json_dir:
            json_dir.mkdir(parents=True, exist_ok=True)
            meta = {"machine": machine, "new_tokens": new_tokens, "prompt_texts": prompts, "chunks": CHUNKS}
            (json_dir / f"{name}.json").write_text(json.dumps(meta | result, indent=1))
    return table(header, rows)
