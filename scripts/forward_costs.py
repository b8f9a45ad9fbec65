"""What one forward of the embedded target costs per weight format, against what the memory bus allows.

Per format (float32, bfloat16: the GGUF dequantized; gguf-int4: its Q4_1 blocks kept, quant gguf):
  weight bytes read per token  every linear's weights (packed codes + scales/zeros for int4) and the LM head;
                               the embedding is a gather of one row and is left out
  forward ms by rows           median T-token forward on a 64-token cache, T = 1..9 (dtype_choice.time_forwards,
                               the verify cost table the adaptive controller meets)
  bound                        weight bytes ÷ measured bandwidth (a bf16 sum over 512 MB): no forward can be faster
and what keeping the blocks changes in the numbers: the int4 kernel's weights ((q − 8)·bf16(d) + bf16(m + 8d)) vs
the file's exact dequantization (q·d + m in float32), and each format's logits vs the float32 model's (the file's
exact weights) over a real prompt; and whether the int4 kernel computes a row the same alone, among R rows, and
padded to 2 rows (bitwise).

Run: python scripts/forward_costs.py [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FORMATS = ("float32", "bfloat16", "gguf-int4")
ROWS = tuple(range(1, 10))
PROMPT = "Explain in a few sentences why the sky is blue, and what changes at sunset."


def kernel_weight_error(path: Path) -> dict[str, float]:
    """Max |Δw| of the int4 kernel's weights vs the file's exact dequantization, over every Q4_1 tensor."""
    from localspec.models.gguf_linear import GROUP, _gguf_tensors, dequantize_q4_1, q4_1_fields

    _, tensors = _gguf_tensors(path)
    worst, worst_rel, bf16_dense = 0.0, 0.0, 0.0
    for kind, raw in tensors.values():
        if kind != "Q4_1":
            continue
        exact = dequantize_q4_1(raw)  # [N, K]
        fields = q4_1_fields(raw)
        rows, k = fields.codes.shape
        d = fields.d.float().bfloat16().float()[..., None]
        zero = (fields.m.float() + 8 * fields.d.float()).bfloat16().float()[..., None]
        kernel = ((fields.codes.reshape(rows, k // GROUP, GROUP).float() - 8) * d + zero).reshape(rows, k)
        diff = (kernel - exact).abs().max().item()
        worst = max(worst, diff)
        worst_rel = max(worst_rel, diff / exact.abs().max().item())
        bf16_dense = max(bf16_dense, (exact.bfloat16().float() - exact).abs().max().item())
    return {"int4_kernel_max_abs_dw": worst, "int4_kernel_max_rel_dw": worst_rel, "bf16_dense_max_abs_dw": bf16_dense}


@torch.inference_mode()
def int4_row_independence(path: Path, names=("blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight")):
    """Per layer: is each row of an R-row int4 forward (R = 1..9) bitwise the row computed alone, and is a row padded
    with a zero row to 2 rows bitwise the row alone?"""
    from localspec.models.gguf_linear import _gguf_tensors, int4_from_q4_1

    _, tensors = _gguf_tensors(path)
    out = {}
    for name in names:
        layer = int4_from_q4_1(tensors[name][1])
        x = torch.randn(9, layer.in_features, generator=torch.Generator().manual_seed(0)).bfloat16()  # [9, K]
        alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])  # [9, N]
        padded = torch.cat([layer(torch.cat([x[i : i + 1], torch.zeros_like(x[:1])]))[:1] for i in range(9)])
        out[name] = {
            "rows_equal_alone": {str(r): bool(torch.equal(layer(x[:r]), alone[:r])) for r in range(1, 10)},
            "padded_to_2_equal_alone": bool(torch.equal(padded, alone)),
        }
    return out


@torch.inference_mode()
def logits_vs_float32(models: dict[str, torch.nn.Module], ids: list[int]) -> dict[str, dict[str, float]]:
    """Each format's prefill logits over `ids` vs float32's: max |Δlogit| and the share of positions whose argmax
    agrees."""
    batch = torch.tensor([ids])
    reference = models["float32"](batch).logits[0].float()  # [T, V]
    out = {}
    for name, model in models.items():
        logits = model(batch).logits[0].float()
        out[name] = {
            "max_abs_dlogit": (logits - reference).abs().max().item(),
            "argmax_agrees": (logits.argmax(-1) == reference.argmax(-1)).float().mean().item(),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from localspec.bench.costs import bandwidth_gbs, weight_bytes
    from localspec.config import ModelSpec
    from localspec.models.dtype_choice import format_fields, time_forwards
    from localspec.models.loading import gguf_file, load_causal_lm, load_tokenizer, resolve_folder
    from localspec.models.registry import parse_registry

    pair = parse_registry((REPO / "models.yaml").read_text(encoding="utf-8"), REPO)[0]
    spec: ModelSpec = pair.target
    cpu = torch.device("cpu")
    models = {
        label: load_causal_lm(replace(spec, **format_fields(label)), "forward_costs", cpu, "target")[0]
        for label in FORMATS
    }
    tokenizer = load_tokenizer(resolve_folder(spec, "forward_costs"))
    messages = [{"role": "user", "content": PROMPT}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    agreement = logits_vs_float32(models, ids)
    gbs = bandwidth_gbs()
    times = time_forwards(models, ROWS)
    report = {
        "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""),
        "torch_threads": torch.get_num_threads(),
        "load_1m": os.getloadavg()[0],
        "bandwidth_gbs": gbs,
        "formats": {},
        "weights": kernel_weight_error(gguf_file(spec.source)),
        "int4_row_independence": int4_row_independence(gguf_file(spec.source)),
        "logits_vs_float32": agreement,
    }
    for label, model in models.items():
        nbytes = weight_bytes(model)
        report["formats"][label] = {
            "weight_mb_per_token": nbytes / 1e6,
            "bound_ms": nbytes / (gbs * 1e9) * 1e3,
            "forward_ms": {str(t): s * 1e3 for t, s in times.get(label, {}).items()},
        }
    print(f"{report['cpu']}, {report['torch_threads']} threads, load {report['load_1m']:.1f}: {gbs:.1f} GB/s")
    print("| format | weights read / token | bound | " + " | ".join(f"{t} rows" for t in ROWS) + " |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in ROWS) + " |")
    for label, row in report["formats"].items():
        cells = " | ".join(f"{row['forward_ms'].get(str(t), float('nan')):.1f}" for t in ROWS)
        print(f"| {label} | {row['weight_mb_per_token']:.0f} MB | {row['bound_ms']:.1f} ms | {cells} |")
    shown = ("weights", "int4_row_independence", "logits_vs_float32")
    print(json.dumps({key: report[key] for key in shown}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
