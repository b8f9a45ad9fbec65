"""What the loaded pair runs on, as data for the stats panel header: device, dtype, quantization, sampler kernel, and
the target's forward plan (its one-line summary, each choice's reason for the tooltip)."""

from __future__ import annotations

from typing import Optional


def dtype_text(loaded) -> str:
    """The dtype the target runs in and why, e.g. 'bfloat16 (auto: 1-token 22 ms vs 37 ms float32, …)'."""
    return loaded.dtype.describe() if loaded.dtype is not None else loaded.spec.target.dtype


def runtime_of(session) -> Optional[dict]:
    """{"device", "dtype", "quant", "sampler", "plan", "plan_reasons"} of a ChatSession; None for a session without a
    loaded pair."""
    loaded = session.loaded if session is not None else None
    if loaded is None:
        return None
    from localspec.verify import get_verifier

    sampler = get_verifier(session.default_spec().sampler, loaded.device)[0]  # what the next answer verifies with
    plan = getattr(getattr(session, "engine", None), "target", None)
    plan = getattr(plan, "plan", None)
    return {
        "device": str(loaded.device),
        "dtype": dtype_text(loaded),
        "quant": loaded.quant,
        "sampler": sampler,
        "plan": plan.summary() if plan is not None else None,
        "plan_reasons": plan_reasons(plan) if plan is not None else None,
    }


def plan_reasons(plan) -> str:
    """Each choice of a ForwardPlan with its reason, one per line ('lm_head: q8 — the file's Q8_0 blocks …')."""
    lines = []
    for name, choice in plan.to_dict().items():
        if isinstance(choice, dict) and "value" in choice:
            lines.append(f"{name}: {choice['value']} — {choice['reason']}")
        elif isinstance(choice, dict):
            lines += [f"{name} {part}: {c['value']} — {c['reason']}" for part, c in choice.items()]
    return "\n".join(lines)
