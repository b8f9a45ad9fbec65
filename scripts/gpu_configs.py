"""GPU checks of the configurations (issue 16), run by scripts/gpu_check.sh; each part prints one JSON object.

  python scripts/gpu_configs.py exactness   fused Triton sampler vs the torch reference at V 151,936 / 152,064, fp32
                                            and bf16 logits, K 1/3/8, greedy and stochastic, a 151,936-wide draft
                                            zero-padded to 152,064 (the Qwen2.5 pair)
  python scripts/gpu_configs.py costs       a real-shaped random pair: Qwen2-7B width cut to 4 layers (bf16 and nf4)
                                            with a 24-layer Qwen2.5-0.5B-shaped draft: 1-token vs (K+1)-token target
                                            forward and per-token draft cost, CUDA events, median of 20
  python scripts/gpu_configs.py e2e         tokens/s for proposer none / ngram / draft / head on that pair, against
                                            transformers generate and assisted generation on the same GPU
--tiny runs every part on the CPU at hidden 64 / 2 layers (plumbing only; timings there mean nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

TARGET_V, DRAFT_V = 152064, 151936
REAL = dict(
    target=dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_attention_heads=28,
        num_key_value_heads=4,
        num_hidden_layers=4,
        vocab_size=TARGET_V,
        tie_word_embeddings=False,
    ),
    draft=dict(
        hidden_size=896,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        num_hidden_layers=24,
        vocab_size=DRAFT_V,
        tie_word_embeddings=True,
    ),
)
TINY = dict(
    target=dict(
        REAL["target"],
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
    ),
    draft=dict(
        REAL["draft"],
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
    ),
)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def exactness(tiny: bool) -> dict:
    from localspec.verify import get_verifier
    from localspec.verify.checks import compare_outputs, make_verify_case
    from localspec.verify.reference import rejection_sample

    dev = device()
    name, fused = get_verifier("triton", dev)
    rows, failures = 0, []
    ks = (1,) if tiny else (1, 3, 8)
    for vocab in (TARGET_V,) if tiny else (DRAFT_V, TARGET_V):
        for dtype in (torch.float32,) if tiny else (torch.float32, torch.bfloat16):
            for k in ks:
                for temperature in (0.0, 1.0):
                    case = make_verify_case(
                        vocab + k,
                        4 if not tiny else 1,
                        k,
                        vocab,
                        temperature=temperature,
                        with_draft_probs=True,
                        dtype=dtype,
                        device=dev,
                    )
                    if vocab == TARGET_V:  # the Qwen2.5 draft: 151,936 columns, zero-padded to the target's width
                        probs = case.draft_probs.clone()
                        probs[..., DRAFT_V:] = 0
                        probs = probs / probs.sum(-1, keepdim=True)
                        case = type(case)(
                            case.target_logits,
                            case.draft_token_ids.clamp(max=DRAFT_V - 1),
                            probs,
                            case.sampling,
                            case.draws,
                        )
                    problems = compare_outputs(case.run(fused), case.run(rejection_sample))
                    rows += 1
                    if problems:
                        failures.append(
                            {"vocab": vocab, "dtype": str(dtype), "k": k, "T": temperature, "problems": problems[:2]}
                        )
    return {"device": str(dev), "sampler": name, "cases": rows, "failures": failures, "ok": not failures}


def build_pair(tiny: bool, quant: str, folder: Path):
    """The random real-shaped pair on the device (target bf16 or nf4, draft bf16)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Qwen2Config

    shapes = TINY if tiny else REAL
    dev = device()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    models = {}
    for role in ("target", "draft"):
        torch.manual_seed(0 if role == "target" else 1)
        config = Qwen2Config(max_position_embeddings=4096, **shapes[role])
        path = folder / role
        if not (path / "config.json").exists():
            with torch.device(dev):  # random init on the GPU: seconds, not a minute of CPU time for 1B parameters
                AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(path)
        kwargs = {"dtype": dtype}
        if role == "target" and quant == "nf4":
            kwargs.update(
                quantization_config=BitsAndBytesConfig(
                    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
                ),
                device_map={"": 0} if dev.type == "cuda" else {"": "cpu"},
            )
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        models[role] = (model if "device_map" in kwargs else model.to(dev)).eval()
    return models["target"], models["draft"]


def _timed(fn, repeats: int) -> float:
    """Median ms of fn() (CUDA events on a GPU, perf_counter on the CPU)."""
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def costs(tiny: bool, folder: Path) -> dict:
    from localspec.runtime.model_runner import ModelRunner

    repeats = 3 if tiny else 20
    report = {"device": str(device()), "shape": "tiny" if tiny else "Qwen2-7B width x 4 layers + 24-layer 0.5B"}
    prompt = list(range(3, 131))
    for quant in ("none", "nf4"):
        target, draft = build_pair(tiny, quant, folder)
        runner = ModelRunner(target)
        row = {}
        for k in (0, 1, 2, 4, 8):

            def step(runner=runner, k=k):
                runner.crop(len(prompt))
                runner.extend([7] * (k + 1))

            runner.reset()
            runner.extend(prompt, logits_to_keep=0)
            step()
            row[f"target_ms_{k + 1}tok"] = round(_timed(step, repeats), 3)
        row["verify_cost_ratio_K4"] = round(row["target_ms_5tok"] / row["target_ms_1tok"], 3)
        if quant == "none":
            drunner = ModelRunner(draft)

            def draft_token(drunner=drunner):
                drunner.crop(len(prompt))
                drunner.extend([7], logits_to_keep=1)

            drunner.reset()
            drunner.extend(prompt, logits_to_keep=0)
            report["draft_ms_per_token"] = round(_timed(draft_token, repeats), 3)
        report[f"target_{quant if quant != 'none' else 'unquantized'}"] = row
        target = draft = runner = None  # the nf4 target loads next: free the bf16 one first
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    unquantized = report["target_unquantized"]["target_ms_1tok"]
    report["draft_over_target_1tok"] = round(report["draft_ms_per_token"] / unquantized, 3)
    return report


def e2e(tiny: bool, folder: Path) -> dict:
    from localspec.chat import ChatSession
    from localspec.config import ModelSpec, NgramSpec, PairSpec, SamplingParams
    from localspec.heads.config import HeadConfig, target_shapes
    from localspec.heads.model import FeatureHead
    from localspec.models.loading import LoadedPair
    from localspec.testing import make_tiny_tokenizer

    max_new = 16 if tiny else 128
    target, draft = build_pair(tiny, "none", folder)
    tokenizer = make_tiny_tokenizer(folder / "tok")
    config = HeadConfig(kind="eagle", num_modules=1, draft_vocab_size=4096, **target_shapes(target.config))
    head = FeatureHead(config, target.get_input_embeddings().weight)
    head.set_lm_weight(target.get_output_embeddings().weight)
    for module in head.layers:
        module.init_from_target_layer(target.model.layers[-1])
    head = head.to(device=device(), dtype=target.dtype).eval()
    spec = PairSpec(
        name="real-shaped",
        target=ModelSpec("random"),
        draft=ModelSpec("random"),
        head="random",
        ngram=NgramSpec(1, 4),
        k=4,
        default_proposer="draft",
    )
    session = ChatSession(LoadedPair(spec, target, tokenizer, draft, device(), 0.0, "none", head=head))
    prompt = [1] + [72, 101, 108, 108, 111, 32] * 20
    sampling = SamplingParams(max_new_tokens=max_new)
    report = {"device": str(device()), "tokens": max_new, "notices": list(session.notices)}
    for proposer in ("none", "ngram", "draft", "head"):
        spec_config = session.default_spec(proposer=proposer, adaptive=False)
        list(session.stream_ids(prompt, SamplingParams(max_new_tokens=4), spec_config, None))  # warm-up
        t0 = time.perf_counter()
        events = list(session.stream_ids(prompt, sampling, spec_config, None))
        seconds = time.perf_counter() - t0
        stats = events[-1].stats
        report[proposer] = {
            "tok_s": round(stats.emitted / seconds, 1),
            "acceptance": round(stats.acceptance_rate, 3),
            "error": events[-1].error,
        }
    ids = torch.tensor([prompt], device=device())
    # the draft's 151,936 rows vs the target's 152,064: transformers asks for both tokenizers (universal assisted)
    assisted = {"assistant_model": draft, "tokenizer": tokenizer, "assistant_tokenizer": tokenizer}
    for name, kwargs in (("hf_generate", {}), ("hf_assisted", assisted)):
        try:
            target.generate(ids, max_new_tokens=4, do_sample=False, **kwargs)
            t0 = time.perf_counter()
            out = target.generate(ids, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, **kwargs)
            report[name] = {"tok_s": round((out.shape[1] - ids.shape[1]) / (time.perf_counter() - t0), 1)}
        except Exception as exc:  # assisted generation refuses some pairs; say which and why
            report[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return report


def rounding(tiny: bool, folder: Path) -> dict:
    """1-row vs R-row logits (R = 2..17) of the random target at the same positions, per forward setup: the fast one
    (sdpa), the exact one (model_runner.exact_setup), and the exact one with torch's deterministic algorithms and
    every forward padded to a multiple of 8 rows (cuBLAS picks kernels by shape). Counts positions whose logits are
    not bitwise equal; records, does not judge (ok is always true)."""
    from localspec.runtime.model_runner import FAST, ForwardSetup, ModelRunner, exact_setup_for

    target, _ = build_pair(tiny, "none", folder)
    exact = exact_setup_for(target)
    setups = {
        "fast": (FAST, False),
        "exact": (exact, False),
        "exact+deterministic": (exact, True),
        "exact, multiples of 8 rows": (ForwardSetup("eager", True, min_rows=8, row_multiple=8), True),
    }
    generator = torch.Generator().manual_seed(0)
    vocab, prefix, new = target.config.vocab_size, 64, 16 if tiny else 24
    ids = torch.randint(0, vocab, (prefix + new,), generator=generator).tolist()
    report = {"device": str(device()), "dtype": str(target.dtype), "positions": new, "setups": {}}
    for name, (setup, deterministic) in setups.items():
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        runner = ModelRunner(target, compile="off", setup=setup)
        runner.reset()
        runner.extend(ids[:prefix], logits_to_keep=0)
        plain = torch.cat([runner.extend([t]).logits.float() for t in ids[prefix:]])  # [new, V]
        per_r = {}
        for rows in range(2, 18):
            runner.crop(prefix)
            chunks = [runner.extend(ids[prefix + i : prefix + i + rows]).logits for i in range(0, new, rows)]
            got = torch.cat(chunks).float()
            per_r[rows] = {
                "unequal": int((got != plain).any(-1).sum()),
                "max_abs_diff": float((got - plain).abs().max()),
            }
        report["setups"][name] = {
            "unequal": sum(r["unequal"] for r in per_r.values()),
            "max_abs_diff": max(r["max_abs_diff"] for r in per_r.values()),
            "per_rows": per_r,
        }
    torch.use_deterministic_algorithms(False)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("exactness", "costs", "e2e", "rounding"))
    parser.add_argument("--tiny", action="store_true", help="hidden 64 / 2 layers on any device (plumbing only)")
    parser.add_argument("--models", default=None, help="folder for the random models (default: a temporary one)")
    args = parser.parse_args()
    folder = Path(args.models or tempfile.mkdtemp(prefix="gpu-configs-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.part == "exactness":
        report = exactness(args.tiny)
    elif args.part == "costs":
        report = costs(args.tiny, folder)
    elif args.part == "rounding":
        report = rounding(args.tiny, folder)
    else:
        report = e2e(args.tiny, folder)
    print(json.dumps(report, indent=1))
    return 0 if report.get("ok", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
