"""`localspec selftest`: does this install sample correctly on this machine? A pass/fail table (or --json).

1. sampler chi-square: the torch reference's emitted tokens follow the target distribution (and the fused kernel's
   too, on CUDA, where it runs fast enough for 20000 samples);
2. kernel vs reference: the fused Triton sampler emits the reference's tokens on random cases (compiled on CUDA, in
   the Triton interpreter on small cases without CUDA; skipped where Triton is not installed);
3. greedy losslessness: on the loaded model, speculative decoding (n-gram proposer) emits what plain decoding
   (proposer none) emits on two short prompts, as the loaded compute path's guarantee states (verify/guarantee.py):
   token for token, or except at a near-tie below the path's measured rounding bound. The guarantee is printed.
Exit code 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from localspec.config import SamplingParams
from localspec.engine.events import steps
from localspec.verify import get_verifier, rejection_sample, triton_available
from localspec.verify.checks import compare_outputs, emitted_distribution_pvalues, make_verify_case

from .common import add_model_options

# short answers that repeat themselves, so the n-gram proposer gets drafts accepted and rejected
PROMPTS = (
    "List the numbers from 1 to 12, separated by commas.",
    "Repeat this sentence three times: the cat sat on the mat.",
)
GREEDY_TOKENS = 24
CHI_SQUARE_SAMPLES = 20000
MIN_P = 1e-4


@dataclass
class CheckResult:
    name: str
    status: str  # "pass" | "fail" | "skip"
    detail: str
    seconds: float = 0.0


def add_parser(sub) -> None:
    parser = sub.add_parser("selftest", help="check the samplers and greedy losslessness on this machine")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--skip-model", action="store_true", help="skip the check that loads a model")
    add_model_options(parser)


def _device(args) -> torch.device:
    if args.device:  # add_model_options declares it
        return torch.device(args.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _fused_mode(device: torch.device) -> str:
    if not triton_available():
        return "not installed"
    from localspec.verify import triton_fused

    return "interpreter" if triton_fused.INTERPRETED else f"compiled ({device.type})"


def _rand_probs(gen: torch.Generator, rows: int, vocab: int, sharp: float = 2.0) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, vocab, generator=gen) * sharp, -1)


def chi_square_cases() -> list[tuple[str, torch.Tensor, torch.Tensor | None, SamplingParams]]:
    gen = torch.Generator().manual_seed(1)
    ngram_target = _rand_probs(gen, 3, 8, sharp=1.0)
    ngram_target[:, -2:] += 0.5  # make the n-gram's fixed draft tokens likely enough to test later positions
    ngram_target /= ngram_target.sum(-1, keepdim=True)
    from localspec.runtime.sampling import logits_to_probs

    filtered = SamplingParams(temperature=0.7, top_k=4)
    filtered_logits = torch.randn(3, 10, generator=gen) * 2
    filtered_draft = logits_to_probs(filtered_logits[:2] + torch.randn(2, 10, generator=gen), filtered)
    return [
        ("draft model, T=1", _rand_probs(gen, 3, 12), _rand_probs(gen, 2, 12), SamplingParams(temperature=1.0)),
        ("n-gram, T=1", ngram_target, None, SamplingParams(temperature=1.0)),
        ("draft model, T=0.7 top-k 4", torch.softmax(filtered_logits, -1), filtered_draft, filtered),
    ]


def check_chi_square(name: str, sampler: Callable, device: torch.device) -> CheckResult:
    worst, parts = 1.0, []
    for label, target_probs, draft_probs, sampling in chi_square_cases():
        p1, p2, pb, _n2, _nb = emitted_distribution_pvalues(
            sampler, target_probs, draft_probs, sampling, samples=CHI_SQUARE_SAMPLES, device=device
        )
        worst = min(worst, p1, p2, pb)
        parts.append(f"{label}: min p {min(p1, p2, pb):.3g}")
    status = "pass" if worst > MIN_P else "fail"
    return CheckResult(name, status, f"{CHI_SQUARE_SAMPLES} samples each; " + "; ".join(parts))


def check_kernel_vs_reference(device: torch.device) -> CheckResult:
    name = "fused kernel = reference"
    if not triton_available():
        return CheckResult(name, "skip", "triton is not installed: the torch reference is the only sampler")
    from localspec.verify.triton_fused import INTERPRETED, fused_rejection_sample

    if device.type != "cuda" and not INTERPRETED:
        return CheckResult(name, "skip", f"Triton kernels do not run on {device.type}")
    if INTERPRETED:
        shapes, vocabs, where = [(2, 3)], [1000], "Triton interpreter, small cases"
    else:
        shapes, vocabs, where = [(1, 8), (4, 3)], [32000, 151936], "compiled"
    cases = failures = 0
    first_problem = ""
    for vocab in vocabs:
        for batch, k in shapes:
            for seed, (temperature, with_draft) in enumerate([(0.0, False), (0.0, True), (0.7, False), (1.3, True)]):
                case = make_verify_case(
                    seed, batch, k, vocab, temperature=temperature, with_draft_probs=with_draft, device=device
                )
                problems = compare_outputs(case.run(fused_rejection_sample), case.run(rejection_sample))
                cases += 1
                if problems:
                    failures += 1
                    first_problem = first_problem or f"B={batch} K={k} V={vocab} T={temperature}: {problems[0]}"
    if failures:
        return CheckResult(name, "fail", f"{failures}/{cases} cases differ ({where}); first: {first_problem}")
    return CheckResult(name, "pass", f"{cases} random cases, tokens and counts identical ({where})")


def check_greedy_lossless(args, device: torch.device, info: dict) -> CheckResult:
    from localspec.config import SpecConfig
    from localspec.verify.greedy_check import compare_greedy
    from localspec.verify.guarantee import guarantee_for_model

    from .common import load_session

    name = "greedy losslessness"
    session = load_session(args, load_draft=False)
    loaded = session.loaded
    guarantee = guarantee_for_model(loaded.target, loaded.quant, loaded.device.type, loaded.exact_on)
    info["guarantee"] = guarantee.to_dict()
    if "ngram" not in session.proposers:
        return CheckResult(name, "skip", f"model pair {loaded.spec.name!r} has no n-gram proposer")
    spec = session.default_spec(proposer="ngram", adaptive=False).validate()
    sampler_name = get_verifier(spec.sampler, loaded.device)[0]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=GREEDY_TOKENS)
    plain_spec = SpecConfig(proposer="none")
    details = []
    for prompt in PROMPTS:
        ids, _notice = session.prompt_ids([{"role": "user", "content": prompt}], GREEDY_TOKENS)
        plain = [t.token_id for ev in steps(session.stream_ids(ids, sampling, plain_spec)) for t in ev.tokens]
        spec_tokens, accepted = [], 0
        for ev in steps(session.stream_ids(ids, sampling, spec)):
            spec_tokens.extend(t.token_id for t in ev.tokens)
            accepted = ev.stats.accepted
        result = compare_greedy(loaded.target, ids, plain, spec_tokens, guarantee)
        if not result.ok:
            return CheckResult(name, "fail", f"{prompt!r}: {result.detail} (guarantee: {guarantee.greedy})")
        details.append(f"{result.detail}, {accepted} drafts accepted")
    return CheckResult(
        name,
        "pass",
        f"{loaded.spec.name}, {guarantee.path}, n-gram K={spec.k}, sampler "
        f"{sampler_name}, greedy {guarantee.short}: " + "; ".join(details),
    )


def _timed(fn: Callable[[], CheckResult], name: str) -> CheckResult:
    t0 = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # a check that crashes is a failed check, reported, not a traceback
        result = CheckResult(name, "fail", f"{type(exc).__name__}: {exc}")
    result.seconds = time.perf_counter() - t0
    return result


def run_checks(args) -> tuple[list[CheckResult], dict]:
    device = _device(args)
    fused_mode = _fused_mode(device)
    results = [
        _timed(
            lambda: check_chi_square("sampler chi-square (torch reference)", rejection_sample, device),
            "sampler chi-square (torch reference)",
        )
    ]
    if device.type == "cuda" and fused_mode.startswith("compiled"):
        from localspec.verify.triton_fused import fused_rejection_sample

        results.append(
            _timed(
                lambda: check_chi_square("sampler chi-square (fused kernel)", fused_rejection_sample, device),
                "sampler chi-square (fused kernel)",
            )
        )
    results.append(_timed(lambda: check_kernel_vs_reference(device), "fused kernel = reference"))
    info = {
        "device": str(device),
        "torch": torch.__version__,
        "fused_kernel": fused_mode,
        "sampler_auto": get_verifier("auto", device)[0],
        "guarantee": None,
    }
    if args.skip_model:
        results.append(CheckResult("greedy losslessness", "skip", "--skip-model"))
    else:
        results.append(_timed(lambda: check_greedy_lossless(args, device, info), "greedy losslessness"))
    return results, info


def run(args) -> int:
    results, info = run_checks(args)
    passed = all(r.status != "fail" for r in results)
    if args.json:
        print(json.dumps({"passed": passed, **info, "checks": [asdict(r) for r in results]}))
    else:
        print(
            f"localspec selftest: device {info['device']}, torch {info['torch']}, fused kernel: "
            f"{info['fused_kernel']}, sampler auto → {info['sampler_auto']}"
        )
        width = max(len(r.name) for r in results)
        print(f"{'check':<{width}}  result  {'time':>7}  detail")
        for r in results:
            print(f"{r.name:<{width}}  {r.status.upper():<6}  {r.seconds:6.1f}s  {r.detail}")
        if info["guarantee"] is not None:
            print(f"guarantee ({info['guarantee']['greedy']}): {info['guarantee']['text']}")
        print("all checks passed" if passed else "SOME CHECKS FAILED", file=sys.stderr)
    return 0 if passed else 1
