"""Aggregate a BenchRun per mode and category; write results.json, results.md and PNG plots (matplotlib Agg)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .forecast import forecast_check
from .forecast import to_markdown as forecast_markdown
from .llama_cpp import LLAMA_MODES
from .llama_report import markdown as llama_markdown
from .llama_report import own_timings, peers_markdown, versus_llama_bench
from .modes import HF_MODES, SWEPT, TREE_MODES, Mode
from .prefill_report import markdown as prefill_markdown
from .prefill_report import prefill_figures
from .runner import BenchRun

ALL = "all"
PLOTS = ("tokens_per_s.png", "acceptance_by_position.png", "k_sweep.png")


def _same_prefix(ids: list[int], reference: list[int]) -> bool:
    shorter = min(len(ids), len(reference))
    return ids[:shorter] == reference[:shorter]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(run: BenchRun) -> dict:
    """Per mode label and category ('all' included): throughput, ratios, acceptance and the time split."""
    categories = list(dict.fromkeys(r.prompt.category for r in run.records)) + [ALL]
    labels = [m.label for m in run.modes]
    hf_label = next((m.label for m in run.modes if m.name == "hf"), None)
    none_label = next((m.label for m in run.modes if m.name == "none"), None)
    rows: dict[str, dict[str, dict]] = {}
    for mode in run.modes:
        rows[mode.label] = {}
        for category in categories:
            records = [r for r in run.records if category in (ALL, r.prompt.category)]
            results = [r.results[mode.label] for r in records]
            tokens = sum(x.new_tokens for x in results)
            seconds = sum(x.seconds for x in results)
            cpu_seconds = sum(x.cpu_seconds for x in results)
            row = {
                "mode": mode.name,
                "k": mode.k,
                "proposer": mode.proposer,
                "prompts": len(results),
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds if seconds else 0.0,
                "cpu_seconds": cpu_seconds,
                "tokens_per_cpu_s": tokens / cpu_seconds if cpu_seconds else 0.0,
            }
            if results and results[0].stats is not None:
                stats = [x.stats for x in results]
                drafted = sum(s.drafted for s in stats)
                accepted = sum(s.accepted for s in stats)
                forwards = sum(s.target_forwards for s in stats)
                width = max(len(s.per_position_drafted) for s in stats)
                pos_drafted = [
                    sum(s.per_position_drafted[i] for s in stats if i < len(s.per_position_drafted))
                    for i in range(width)
                ]
                pos_accepted = [
                    sum(s.per_position_accepted[i] for s in stats if i < len(s.per_position_accepted))
                    for i in range(width)
                ]
                time_s = {
                    "propose": sum(s.propose_s for s in stats),
                    "score": sum(s.score_s for s in stats),
                    "sampler": sum(s.sampler_s for s in stats),
                }
                row.update(
                    {
                        "drafted": drafted,
                        "accepted": accepted,
                        "target_forwards": forwards,
                        "acceptance_rate": accepted / drafted if drafted else None,
                        "mean_acceptance_length": tokens / forwards if forwards else None,
                        "per_position_acceptance": [a / d if d else None for a, d in zip(pos_accepted, pos_drafted)],
                        "per_position_drafted": pos_drafted,
                        "time_share": {name: spent / seconds if seconds else 0.0 for name, spent in time_s.items()},
                    }
                )
                row["time_share"]["other"] = 1.0 - sum(row["time_share"].values())
                steps = [k for x in results for k in x.k_per_step]
                if steps:
                    row["mean_k"] = sum(steps) / len(steps)
                    row["plain_step_share"] = sum(k == 0 for k in steps) / len(steps)
            prefill = prefill_figures(results, [len(r.prompt_ids) for r in records])
            if prefill is not None:
                row["prefill"] = prefill
            own = own_timings([x.peer_timings for x in results if x.peer_timings])
            if own is not None:  # a llama.cpp mode: llama.cpp's own timings, and its drafts' acceptance
                row["llama_timings"] = own
                row["acceptance_rate"] = own.get("draft_acceptance")
            if hf_label is not None:
                row["same_as_hf"] = sum(
                    _same_prefix(r.results[mode.label].token_ids, r.results[hf_label].token_ids) for r in records
                )
                row["exactly_hf"] = sum(
                    r.results[mode.label].token_ids == r.results[hf_label].token_ids for r in records
                )
            tasks = [r.results[mode.label] for r in records if r.prompt.schema is not None]
            if tasks:  # the JSON-schema task: complete answers valid against their schema, answers cut short
                row["schema_answers"] = sum(x.schema_valid is not None for x in tasks)
                row["schema_valid"] = sum(x.schema_valid is True for x in tasks)
                row["schema_cut"] = len(tasks) - row["schema_answers"]
            if none_label is not None and mode.label != none_label:
                row["same_as_none"] = sum(
                    r.results[mode.label].token_ids == r.results[none_label].token_ids for r in records
                )
            rows[mode.label][category] = row
    for label in labels:
        for category in categories:
            row = rows[label][category]
            for prefix, key in (("", "tokens_per_s"), ("cpu_", "tokens_per_cpu_s")):
                for reference, name in ((hf_label, "hf"), (none_label, "none")):
                    row[f"{prefix}speedup_vs_{name}"] = (
                        _ratio(row[key], rows[reference][category][key]) if reference else None
                    )
    sweep = {}
    for name in SWEPT:
        swept = [m for m in run.modes if m.name == name]
        if swept:
            sweep[name] = {c: {str(m.k): rows[m.label][c]["tokens_per_s"] for m in swept} for c in categories}
            sweep[name]["best_k"] = {c: int(max(sweep[name][c], key=sweep[name][c].get)) for c in categories}
            sweep[name]["cpu"] = {
                c: {str(m.k): rows[m.label][c]["tokens_per_cpu_s"] for m in swept} for c in categories
            }
    targets = check_targets(run.modes, rows, categories, "tokens_per_s")
    for target, cpu in zip(targets, check_targets(run.modes, rows, categories, "tokens_per_cpu_s")):
        target["cpu_value"], target["cpu_met"] = cpu["value"], cpu["met"]
    return {
        "categories": categories,
        "rows": rows,
        "k_sweep": sweep,
        "targets": targets,
        "llama_bench": versus_llama_bench(run.machine, run.modes, rows, categories),
        "forecast": forecast_check(run.records, run.modes),
    }


def check_targets(modes: list[Mode], rows: dict, categories: list[str], key: str) -> list[dict]:
    """The issue's targets, each with the measured value and whether it was met (ratios from this run). The best
    mode / K is picked by wall-clock tokens/s, so both measures judge the same pairs."""

    def tps(label: str, category: str = ALL, measure: str = key) -> float:
        return rows[label][category][measure]

    def pick(candidates: list[Mode], category: str = ALL) -> Mode:
        return max(candidates, key=lambda m: tps(m.label, category, "tokens_per_s"))

    by_name: dict[str, list[Mode]] = {}
    for mode in modes:
        by_name.setdefault(mode.name, []).append(mode)
    ours = [m for m in modes if m.name not in HF_MODES + LLAMA_MODES]
    targets = []

    def add(what: str, value: float, goal: float) -> None:
        targets.append({"target": what, "value": value, "goal": goal, "met": value >= goal})

    if "hf" in by_name and ours:
        best = pick(ours)
        add(f"best of our modes ({best.label}) / hf, all prompts", tps(best.label) / tps("hf"), 2.0)
    if "hf-fp32" in by_name and ours:
        best = pick(ours)
        add(f"best of our modes ({best.label}) / hf-fp32, all prompts", tps(best.label) / tps("hf-fp32"), 2.5)
    # issue 23's goals against llama.cpp on the same GGUF: the default setting (adaptive-tree) ≥ 1.5× its plain
    # decoding and ≥ 1.2× its prompt lookup; our plain decoding ≥ 1.0× its plain decoding
    default = by_name.get("adaptive-tree", [])
    for peer, goal in (("llama.cpp", 1.5), ("llama.cpp-lookup", 1.2)):
        if peer in by_name and default:
            add(f"{default[0].label} / {peer}, all prompts", tps(default[0].label) / tps(peer), goal)
    if "ik_llama.cpp" in by_name and default:  # issue 50: the fastest CPU engine, end to end, prefill included
        add(f"{default[0].label} / ik_llama.cpp, all prompts", tps(default[0].label) / tps("ik_llama.cpp"), 1.2)
    if "llama.cpp" in by_name and "none" in by_name:
        add("none / llama.cpp, all prompts", tps("none") / tps("llama.cpp"), 1.0)
    if "ngram" in by_name and "hf-pld" in by_name:
        best = pick(by_name["ngram"] + by_name.get("ngram-tree", []))
        add(
            f"{best.label} / {by_name['hf-pld'][0].label}, all prompts",
            tps(best.label) / tps(by_name["hf-pld"][0].label),
            1.2,
        )
    if "draft" in by_name and "hf-assisted" in by_name:
        best = pick(by_name["draft"])
        add(f"{best.label} / hf-assisted, all prompts", tps(best.label) / tps("hf-assisted"), 1.5)
    if "none" in by_name:
        for mode in ours:
            if mode.name != "none":
                worst = min(categories, key=lambda c: tps(mode.label, c) / tps("none", c))
                value = tps(mode.label, worst) / tps("none", worst)
                add(f"{mode.label} / none, slowest category ({worst})", value, 1.0)
    for adaptive in by_name.get("adaptive", []) + by_name.get("adaptive-tree", []):
        fixed = by_name.get(adaptive.proposer, [])
        if adaptive.name == "adaptive-tree":
            fixed = fixed + [m for m in ours if m.name in TREE_MODES and m.proposer == adaptive.proposer]
        for category in categories:
            if fixed:
                best = pick(fixed, category)
                add(
                    f"{adaptive.label} / best fixed ({best.label}), {category}",
                    tps(adaptive.label, category) / tps(best.label, category),
                    0.95,
                )
    return targets


def to_json(run: BenchRun, summary: dict) -> dict:
    return {
        "model": run.model,
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "max_new_tokens": run.max_new_tokens,
        "greedy": True,
        "machine": run.machine,
        "notes": run.notes,
        "guarantee": run.guarantee,
        "modes": [{"label": m.label, "name": m.name, "k": m.k, "proposer": m.proposer} for m in run.modes],
        "summary": summary,
        "prompts": [
            {
                "id": r.prompt.prompt_id,
                "category": r.prompt.category,
                "subcategory": r.prompt.subcategory,
                "prompt_tokens": len(r.prompt_ids),
                "results": {
                    label: {
                        "new_tokens": x.new_tokens,
                        "seconds": x.seconds,
                        "cpu_seconds": x.cpu_seconds,
                        "tokens_per_s": x.new_tokens / x.seconds if x.seconds else 0.0,
                        "drafted": x.stats.drafted if x.stats else None,
                        "accepted": x.stats.accepted if x.stats else None,
                        "target_forwards": x.stats.target_forwards if x.stats else None,
                        "token_ids": x.token_ids,
                        "llama_timings": x.peer_timings,
                        "schema_valid": x.schema_valid,
                    }
                    for label, x in r.results.items()
                },
            }
            for r in run.records
        ],
    }


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def same_as_hf_note(data: dict) -> str:
    """Which greedy guarantee the *same as hf* column is read against (the loaded compute path's)."""
    guarantee = data.get("guarantee") or {}
    if not guarantee:
        return (
            "Ids can part where two logits tie within float rounding, since a K+1-token forward sums in another order."
        )
    short = guarantee.get("short", guarantee["greedy"])
    return f"Guarantee on this path, greedy {short}: {guarantee['text']}."


def schema_markdown(data: dict) -> list[str]:
    """The JSON-schema task's rows: speed under the grammar and the share of answers valid against their schema."""
    summary = data["summary"]
    categories = [c for c in summary["categories"] if c != ALL]
    rows = [
        (mode["label"], category, summary["rows"][mode["label"]][category])
        for category in categories
        for mode in data["modes"]
        if "schema_answers" in summary["rows"][mode["label"]][category]
    ]
    if not rows:
        return []
    lines = [
        "## JSON-schema task",
        "",
        "Each answer constrained to its schema (llguidance's token mask on the target; the grammar's forced tokens "
        "drafted first); each complete answer checked against its schema by a separate checker "
        "(bench/schema_check.py), an answer cut by the max new tokens counted apart (it is not complete JSON).",
        "",
        "| mode | prompts | tok/s | × none | acceptance | mean acc. len | valid | cut by max tokens | same as none |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, category, row in rows:
        same_none = f"{row['same_as_none']}/{row['prompts']}" if "same_as_none" in row else "–"
        lines.append(
            f"| {label} | {category} | {row['tokens_per_s']:.1f} | {_fmt(row['speedup_vs_none'], '.2f', '×')} | "
            f"{_fmt(row.get('acceptance_rate'), '.0%')} | {_fmt(row.get('mean_acceptance_length'))} | "
            f"{_fmt(row['schema_valid'] / row['schema_answers'] if row['schema_answers'] else None, '.0%')} "
            f"({row['schema_valid']}/{row['schema_answers']}) | {row['schema_cut']} | {same_none} |"
        )
    return lines + [""]


def to_markdown(data: dict) -> str:
    summary, machine = data["summary"], data["machine"]
    categories = summary["categories"]
    counts = {c: summary["rows"][data["modes"][0]["label"]][c]["prompts"] for c in categories}
    before, after, during = machine["load_before"], machine["load_after"], machine["load_1m_during"]
    lines = [
        f"# localspec bench — {data['model']}",
        "",
        f"{data['created']}, greedy, up to {data['max_new_tokens']} new tokens per answer (stop token included), "
        + ", ".join(f"{counts[c]} {c}" for c in categories if c != ALL)
        + " prompts; "
        f"{machine['cpu_count']} CPUs ({machine['processor']}), torch {machine['torch']} with "
        f"{machine['torch_threads']} threads.",
        "",
        f"Machine load (1-minute load average): {before['load_1m']:.1f} before, {after['load_1m']:.1f} after, "
        f"{during['min']:.1f}–{during['max']:.1f} during (mean {during['mean']:.1f}). Modes ran interleaved prompt "
        "by prompt, so the ratios between them are comparable; absolute tokens/s depend on the load.",
        "",
        *(
            [
                f"Background load: {machine['background_load']} busy process(es) ran beside the bench "
                "(`--background-load`), as other programs on a desktop would.",
                "",
            ]
            if machine.get("background_load")
            else []
        ),
    ]
    if machine.get("dtype"):
        lines += [f"Target dtype: {machine['dtype']['text']}.", ""]
    if machine.get("plan"):
        lines += [f"Forward plan: {machine['plan']['summary']}.", ""]
    if machine.get("verify_ms"):
        rows_ms, long = machine["verify_ms"], machine.get("verify_ms_long")
        lines += [
            (
                "Verify cost per row count (median ms of a T-token target forward on a 64-token cache"
                + (f", then on a {long['context']}-token one" if long else "")
                + ", in the forward setup the engine runs, measured before the run):"
            ),
            "",
            "| T tokens | " + " | ".join(rows_ms) + " |",
            "|---|" + "---:|" * len(rows_ms),
        ]
        for label, costs in [("", rows_ms)] + ([(f", {long['context']} cached", long["ms"])] if long else []):
            values = list(costs.values())
            lines += [
                f"| ms{label} | " + " | ".join(f"{v:.1f}" for v in values) + " |",
                f"| × T=1{label} | " + " | ".join(f"{v / costs['1']:.2f}" for v in values) + " |",
            ]
        lines += [""]
    if machine.get("bound") and machine.get("verify_ms"):
        bound = machine["bound"]
        lines += [
            f"Bytes-read bound: {bound['weight_mb']:.0f} MB of weights per token at {bound['bandwidth_gbs']:.1f} GB/s "
            f"(a bf16 sum over 512 MB) = {bound['bound_ms']:.1f} ms; the 1-token forward above is "
            f"{machine['verify_ms']['1'] / bound['bound_ms']:.1f}× that.",
            "",
        ]
    if data["notes"]:
        lines += ["Notes: " + "; ".join(data["notes"]) + ".", ""]
    lines += [
        "| mode | prompts | tok/s | × hf | × none | tok/CPU-s | × none (CPU) | acceptance | mean acc. len "
        "| propose / score / sample / other | same as hf | same as none |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for category in categories:
        for mode in data["modes"]:
            row = summary["rows"][mode["label"]][category]
            share = row.get("time_share")
            split = " / ".join(f"{share[k]:.0%}" for k in ("propose", "score", "sampler", "other")) if share else "–"
            same = f"{row['same_as_hf']}/{row['prompts']}" if "same_as_hf" in row else "–"
            same_none = f"{row['same_as_none']}/{row['prompts']}" if "same_as_none" in row else "–"
            label = mode["label"] + (
                f" (mean K {row['mean_k']:.1f}, {row['plain_step_share']:.0%} plain steps)" if "mean_k" in row else ""
            )
            lines.append(
                f"| {label} | {category} | {row['tokens_per_s']:.1f} | "
                f"{_fmt(row['speedup_vs_hf'], '.2f', '×')} | {_fmt(row['speedup_vs_none'], '.2f', '×')} | "
                f"{row['tokens_per_cpu_s']:.1f} | {_fmt(row['cpu_speedup_vs_none'], '.2f', '×')} | "
                f"{_fmt(row.get('acceptance_rate'), '.0%')} | {_fmt(row.get('mean_acceptance_length'))} | "
                f"{split} | {same} | {same_none} |"
            )
    lines += [
        "",
        "*tok/CPU-s*: tokens per second of CPU time this process used (wall time minus the time other "
        "processes held the cores); with one torch thread it estimates the speed on an idle machine.",
        "*same as hf*: greedy token ids equal to `hf`'s up to the shorter answer. " + same_as_hf_note(data),
        "*same as none*: answers whose greedy token ids are exactly our own plain decoding's (`none`), the promise "
        "of speculation: bitwise identical where the path's guarantee says so.",
        "",
    ]
    lines += schema_markdown(data)
    if summary["k_sweep"]:
        lines += ["## K sweep (tokens/s)", ""]
        for name, sweep in summary["k_sweep"].items():
            ks = list(sweep[categories[0]].keys())
            lines += [
                f"| {name} | " + " | ".join(f"K={k}" for k in ks) + " | best K |",
                "|---|" + "---:|" * (len(ks) + 1),
            ]
            for category in categories:
                lines.append(
                    f"| {category} | "
                    + " | ".join(f"{sweep[category][k]:.1f}" for k in ks)
                    + f" | {sweep['best_k'][category]} |"
                )
            for category in categories:
                cpu = sweep["cpu"][category]
                lines.append(
                    f"| {category}, per CPU-s | "
                    + " | ".join(f"{cpu[k]:.1f}" for k in ks)
                    + f" | {max(cpu, key=cpu.get)} |"
                )
            lines.append("")
    lines += llama_markdown(data)
    lines += peers_markdown(data)
    lines += prefill_markdown(data)
    if summary["targets"]:
        lines += [
            "## Targets",
            "",
            "| target | wall clock | CPU time | goal | met (wall / CPU) |",
            "|---|---:|---:|---:|---|",
        ]
        for target in summary["targets"]:
            lines.append(
                f"| {target['target']} | {target['value']:.2f}× | {target['cpu_value']:.2f}× | "
                f"≥ {target['goal']:.2f}× | {'yes' if target['met'] else 'no'} / "
                f"{'yes' if target['cpu_met'] else 'no'} |"
            )
        lines.append("")
    lines += [
        "![tokens/s by mode and category](tokens_per_s.png)",
        "",
        "![acceptance by draft position](acceptance_by_position.png)",
        "",
        "![K sweep](k_sweep.png)",
        "",
    ]
    lines += forecast_markdown(summary.get("forecast") or {})
    return "\n".join(lines)


def plot(data: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = data["summary"]
    rows, categories = summary["rows"], summary["categories"]
    labels = [m["label"] for m in data["modes"]]
    written = []

    fig, axes = plt.subplots(1, 2, figsize=(2 * max(6.0, 0.8 * len(labels) + 2), 4.4), squeeze=False)
    width = 0.8 / len(categories)
    for ax, key, unit in zip(axes[0], ("tokens_per_s", "tokens_per_cpu_s"), ("wall clock", "CPU time")):
        for ci, category in enumerate(categories):
            values = [rows[label][category][key] for label in labels]
            ax.bar([i + ci * width for i in range(len(labels))], values, width, label=category)
        ax.set_xticks([i + width * (len(categories) - 1) / 2 for i in range(len(labels))])
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(f"tokens per second of {unit}")
        ax.set_title(f"{data['model']}: tokens/s ({unit}), greedy, ≤{data['max_new_tokens']} new tokens", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / PLOTS[0])
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    spec_labels = [label for label in labels if rows[label][ALL].get("per_position_acceptance")]
    fig, axes = plt.subplots(1, len(categories), figsize=(4.2 * len(categories), 3.6), sharey=True, squeeze=False)
    for ax, category in zip(axes[0], categories):
        for label in spec_labels:
            rates = rows[label][category].get("per_position_acceptance") or []
            points = [(i + 1, r) for i, r in enumerate(rates) if r is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_title(category, fontsize=9)
        ax.set_xlabel("draft position")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("P(accepted at position)")
    if spec_labels:
        axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    written.append(out / PLOTS[1])
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    sweeps = list(summary["k_sweep"].items())
    fig, axes = plt.subplots(2, max(1, len(sweeps)), figsize=(5.0 * max(1, len(sweeps)), 7.2), squeeze=False)
    for row_axes, key, unit in zip(axes, ("tokens_per_s", "tokens_per_cpu_s"), ("wall clock", "CPU time")):
        for ax, (name, sweep) in zip(row_axes, sweeps):
            for category in categories:
                ks = [int(k) for k in sweep[category]]
                values = [
                    rows[next(m["label"] for m in data["modes"] if m["name"] == name and m["k"] == k)][category][key]
                    for k in ks
                ]
                line = ax.plot(ks, values, marker="o", label=f"{name}, {category}")[0]
                for reference, style in (("none", ":"), ("adaptive", "--")):
                    ref = next(
                        (
                            label
                            for label in labels
                            if label == reference or label.startswith(reference + " (") and f"({name}," in label
                        ),
                        None,
                    )
                    if ref is not None:
                        ax.axhline(
                            rows[ref][category][key],
                            color=line.get_color(),
                            linestyle=style,
                            lw=1,
                            label=f"{ref.split(' (')[0]}, {category}",
                        )
                ax.set_xticks(ks)
            ax.set_ylim(bottom=0)
            ax.set_xlabel("K (draft tokens per step)")
            ax.set_ylabel(f"tokens per second of {unit}")
            ax.set_title(f"K sweep: {name}, {unit} (dotted: none, dashed: adaptive)", fontsize=9)
            ax.legend(fontsize=6)
        if not sweeps:
            row_axes[0].text(0.5, 0.5, "no K sweep in this run", ha="center", va="center")
    fig.tight_layout()
    written.append(out / PLOTS[2])
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def write_report(run: BenchRun, out: Path) -> dict:
    """Write results.json, results.md and the plots into `out`; return the JSON data."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = to_json(run, summarize(run))
    (out / "results.json").write_text(json.dumps(data, indent=1, ensure_ascii=False))
    (out / "results.md").write_text(to_markdown(data))
    plot(data, out)
    return data
