"""The bench report's reading-the-prompt part: per mode, how fast the prompt was read (prefill tokens per second) and
the mean time to the first answer token, ours from the engine's stats, llama.cpp's from its own timings (its prompt
time and one decode step: its first token), beside the C++ peers' llama-bench pp512 on the same file."""

from __future__ import annotations


def prefill_figures(results: list, prompt_tokens: list[int]) -> dict | None:
    """One mode's answers (RunResult) and their prompts' token counts → {"prefill_tokens_per_s", "mean_ttft_s"}, or
    None where the mode says nothing of its prefill (transformers' modes)."""
    if results and all(x.stats is not None for x in results):
        seconds = sum(x.stats.prefill_s for x in results)
        first = [x.stats.first_token_s for x in results if x.stats.first_token_s is not None]
        return {
            "prefill_tokens_per_s": sum(prompt_tokens) / seconds if seconds else None,
            "mean_ttft_s": sum(first) / len(first) if first else None,
        }
    timings = [x.peer_timings for x in results]
    if results and all(t and t.get("prompt_ms") and t.get("predicted_n") for t in timings):
        prompt_ms = sum(float(t["prompt_ms"]) for t in timings)
        first_ms = [float(t["prompt_ms"]) + float(t["predicted_ms"]) / int(t["predicted_n"]) for t in timings]
        return {
            "prefill_tokens_per_s": sum(int(t["prompt_n"]) for t in timings) / prompt_ms * 1e3,
            "mean_ttft_s": sum(first_ms) / len(first_ms) / 1e3,
        }
    return None


def markdown(data: dict) -> list[str]:
    """A table of every mode's prefill rate and mean time to first token over all prompts, and the peers' pp512."""
    rows = data["summary"]["rows"]
    figures = {m["label"]: rows[m["label"]]["all"].get("prefill") for m in data["modes"]}
    figures = {label: f for label, f in figures.items() if f}
    if not figures:
        return []

    def cell(value: float | None, form: str) -> str:
        return "–" if value is None else format(value, form)

    lines = [
        "## Reading the prompt",
        "",
        "Per mode over all prompts: prompt tokens read per second of prefill, and the mean time from the request to "
        "the first answer token (ours: the engine's `prefill_s` and `first_token_s`; llama.cpp's: its own "
        "`prompt_ms`, and that plus one decode step).",
        "",
        "| mode | prefill tok/s | mean time to first token (s) |",
        "|---|---:|---:|",
    ]
    for label, f in figures.items():
        lines.append(f"| {label} | {cell(f['prefill_tokens_per_s'], '.1f')} | {cell(f['mean_ttft_s'], '.3f')} |")
    peers = {"llama.cpp": data["machine"].get("llama_bench") or {}, **(data["machine"].get("peer_benches") or {})}
    quoted = [f"{name} {line['pp']['tokens_per_s']:.1f}" for name, line in peers.items() if line and "pp" in line]
    if quoted:
        lines += ["", f"llama-bench pp512 on the same file (t/s): {', '.join(quoted)}."]
    return [*lines, ""]
