"""The bench report's llama.cpp part: llama.cpp's own timings of each llama.cpp mode, and llama-bench's pp512 / tg128
on the same file beside the bench's end-to-end rates, so every ratio against llama.cpp can be checked against the
number a llama.cpp user would quote."""

from __future__ import annotations

from .llama_bench import GEN_TOKENS, PROMPT_TOKENS

TG_CLOSE = 0.90  # the llama.cpp mode's end-to-end rate on short prompts should be within 10 % of llama-bench's tg


def _per_second(tokens: float, ms: float) -> float | None:
    return tokens / ms * 1e3 if ms else None


def own_timings(timings: list[dict]) -> dict | None:
    """llama.cpp's own timings summed over answers: prompt and predicted tokens per second (tokens over the time it
    reports for them) and, for a speculative mode, its drafted tokens and their acceptance."""
    timings = [t for t in timings if t]
    if not timings:
        return None

    def total(key: str) -> float:
        return sum(float(t.get(key) or 0) for t in timings)

    out = {
        "prompt_n": int(total("prompt_n")),
        "prompt_per_second": _per_second(total("prompt_n"), total("prompt_ms")),
        "predicted_n": int(total("predicted_n")),
        "predicted_per_second": _per_second(total("predicted_n"), total("predicted_ms")),
    }
    drafted = total("draft_n")
    if drafted:
        out["draft_n"] = int(drafted)
        out["draft_acceptance"] = total("draft_n_accepted") / drafted
    return out


def versus_llama_bench(machine: dict, modes: list, rows: dict, categories: list[str]) -> dict | None:
    """Every mode's end-to-end tokens/s ÷ llama-bench's tg, per category; the llama.cpp modes' own predicted rate ÷
    tg; our 1-token forward's rate ÷ tg. None without a llama-bench line; {"error": …} when it failed."""
    line = machine.get("llama_bench")
    if not line:
        return None
    if "error" in line:
        return {"error": line["error"]}
    tg = line["tg"]["tokens_per_s"]
    out = {
        "tg": tg,
        "pp": line["pp"]["tokens_per_s"],
        "over_tg": {m.label: {c: rows[m.label][c]["tokens_per_s"] / tg for c in categories} for m in modes},
        "own_over_tg": {
            m.label: rows[m.label][categories[-1]]["llama_timings"]["predicted_per_second"] / tg
            for m in modes
            if (rows[m.label][categories[-1]].get("llama_timings") or {}).get("predicted_per_second")
        },
    }
    plain = rows.get("llama.cpp") or {}
    timed = {
        c: plain[c]["llama_timings"]
        for c in categories[:-1]
        if (plain.get(c) or {}).get("llama_timings", {}).get("predicted_n") and plain[c].get("prompts")
    }
    if timed:  # where prefill weighs least (prompt tokens per answer token): does the mode run at llama.cpp's tg?
        shortest = min(timed, key=lambda c: timed[c]["prompt_n"] / timed[c]["predicted_n"])
        out["shortest"] = shortest
        out["shortest_prompt_tokens"] = timed[shortest]["prompt_n"] / plain[shortest]["prompts"]
        out["shortest_answer_tokens"] = timed[shortest]["predicted_n"] / plain[shortest]["prompts"]
    one_row_ms = (machine.get("verify_ms") or {}).get("1")
    if one_row_ms:
        out["our_forward_over_tg"] = 1e3 / one_row_ms / tg
    return out


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def markdown(data: dict) -> list[str]:
    """The report's section on llama.cpp's C++ (no lines when the run had no llama.cpp mode)."""
    line = data["machine"].get("llama_bench")
    check = data["summary"].get("llama_bench")
    if not line:
        return []
    title = "## llama.cpp's C++ on the same file"
    if "error" in line:
        return [title, "", f"llama-bench could not run: {line['error']}", ""]
    pp, tg = line["pp"], line["tg"]
    lines = [
        title,
        "",
        f"`{' '.join(['llama-bench', *line['command'][1:]])}` (build {line['build_commit']}, {line['threads']} "
        f"threads, flash_attn {line['flash_attn']}): **pp{PROMPT_TOKENS} {pp['tokens_per_s']:.1f} ± "
        f"{pp['stddev']:.1f} t/s, tg{GEN_TOKENS} {tg['tokens_per_s']:.1f} ± {tg['stddev']:.1f} t/s**, the numbers a "
        "llama.cpp user would quote. Below, each mode's end-to-end rate (prefill included, as in the table above) "
        f"÷ that tg{GEN_TOKENS}, and the llama.cpp modes' own timings (llama-server's `timings`).",
        "",
    ]
    categories = data["summary"]["categories"]
    lines += [
        "| mode | " + " | ".join(f"{c} ÷ tg" for c in categories) + " | llama.cpp's prompt t/s | llama.cpp's "
        "predicted t/s | predicted ÷ tg | llama.cpp's draft acceptance |",
        "|---|" + "---:|" * (len(categories) + 4),
    ]
    rows = data["summary"]["rows"]
    for mode in data["modes"]:
        label = mode["label"]
        own = rows[label][categories[-1]].get("llama_timings") or {}
        cells = [_ratio(check["over_tg"][label][c]) for c in categories]

        def rate(key: str, own=own) -> str:
            return "–" if own.get(key) is None else f"{own[key]:.1f}"

        acceptance = own.get("draft_acceptance")
        cells += [rate("prompt_per_second"), rate("predicted_per_second"), _ratio(check["own_over_tg"].get(label))]
        cells.append("–" if acceptance is None else f"{acceptance:.0%}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    if "our_forward_over_tg" in check:
        lines += [
            f"Our 1-token forward (the verify cost at T=1 above) runs at {check['our_forward_over_tg']:.2f}× "
            f"llama-bench's tg{GEN_TOKENS}.",
            "",
        ]
    plain = check["over_tg"].get("llama.cpp")
    if plain is not None:
        everything = plain[categories[-1]]
        shortest = check.get("shortest")
        if shortest is not None:
            value = plain[shortest]
            met = "yes" if value >= TG_CLOSE else "no"
            lines.append(
                f"The llama.cpp mode end to end ÷ llama-bench's tg{GEN_TOKENS} where prefill weighs least ({shortest}: "
                f"{check['shortest_prompt_tokens']:.0f} prompt tokens, {check['shortest_answer_tokens']:.0f} answer "
                f"tokens on average): {value:.2f} (within {1 - TG_CLOSE:.0%} of it: {met}); all prompts: "
                f"{everything:.2f} (their prefill is in the mode's time, not in tg)."
            )
        else:
            lines.append(
                f"The llama.cpp mode end to end ÷ llama-bench's tg{GEN_TOKENS}, all prompts: {everything:.2f} "
                "(prefill and the HTTP round trip are in the mode's time, not in tg)."
            )
        lines.append("")
    return lines


def peers_markdown(data: dict) -> list[str]:
    """The other C++ peers' llama-bench on the same file (ik_llama.cpp), beside llama.cpp's: prefill and decode rates,
    and each as a multiple of llama.cpp's. No lines when the run measured none."""
    peers = data["machine"].get("peer_benches") or {}
    if not peers:
        return []
    base = data["machine"].get("llama_bench") or {}
    lines = [
        "## The other C++ peers' llama-bench on the same file",
        "",
        f"| engine | build | pp{PROMPT_TOKENS} t/s | tg{GEN_TOKENS} t/s | pp ÷ llama.cpp's | tg ÷ llama.cpp's |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, line in {"llama.cpp": base, **peers}.items():
        if not line:
            continue
        if "error" in line:
            lines.append(f"| {name} | not measured: {line['error']} | – | – | – | – |")
            continue
        pp, tg = line["pp"]["tokens_per_s"], line["tg"]["tokens_per_s"]
        over = [
            _ratio(value / base[key]["tokens_per_s"]) if "error" not in base and base else "–"
            for key, value in (("pp", pp), ("tg", tg))
        ]
        lines.append(f"| {name} | {line['build_commit']} | {pp:.1f} | {tg:.1f} | {over[0]} | {over[1]} |")
    extra = data["machine"].get("peer_server_args") or {}
    if extra:  # llama-bench ran with its defaults; the servers with these
        said = "; ".join(f"{name}: `{' '.join(args)}`" for name, args in extra.items())
        lines += ["", f"The peers' servers ran with these options added (`--peer-args`): {said}."]
    return [*lines, ""]
