"""What the exact forward setup costs per compute path: the embedded SmolLM2-135M's target forward at T = 1, 5 and 9
rows on a 64-token cache (models/dtype_choice.time_forwards: medians, interleaved round by round), in the fast setup
(sdpa, 1-row decode), the exact setup on eager attention and the exact setup as the engine runs it here
(exact_setup_for: decode / verify attention on the attention kernel where the loader attached it), printed as
milliseconds and as ratios to the fast setup at the same T. `exact: auto` turns the exact setup on where neither
ratio at 1 and K+1 rows exceeds 1.25 (models/exact_choice.py).

Run: python scripts/exact_costs.py [--paths bfloat16,float32,float16] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = (1, 5, 9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default="bfloat16,float32,float16", help="compute dtypes of the dense target")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from localspec.config import ModelSpec
    from localspec.models.dtype_choice import time_forwards
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry
    from localspec.runtime.model_runner import FAST, exact_setup, exact_setup_for

    pair = load_registry(REPO / "models.yaml")[0]
    print(f"# exact setup costs, {torch.get_num_threads()} threads, T = {', '.join(map(str, SIZES))} rows")
    print(
        "| path | setup | "
        + " | ".join(f"T={t} ms" for t in SIZES)
        + " | "
        + " | ".join(f"T={t} ÷ fast" for t in SIZES)
        + " |"
    )
    print("|---|---|" + "---:|" * (2 * len(SIZES)))
    for dtype in args.paths.split(","):
        target = ModelSpec(pair.target.source, "none", dtype, pair.target.trust_remote_code)
        model = load_pair(dataclasses.replace(pair, target=target), device="cpu", load_draft=False, exact="off").target
        engine = exact_setup_for(model)
        setups = {"fast": FAST, "exact, eager": exact_setup(model.dtype), f"exact, {engine.name}": engine}
        times = time_forwards(dict.fromkeys(setups, model), SIZES, setups)
        for name in setups:
            ms = " | ".join(f"{times[name][t] * 1e3:.1f}" for t in SIZES)
            ratio = " | ".join(f"{times[name][t] / times['fast'][t]:.2f}" for t in SIZES)
            print(f"| {dtype} | {name} | {ms} | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
