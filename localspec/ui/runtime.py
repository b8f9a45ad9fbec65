"""What the loaded pair runs on, as data for the stats panel header: device, dtype, quantization, sampler kernel."""

from __future__ import annotations

from typing import Optional


def dtype_text(loaded) -> str:
    """The dtype the target runs in and why, e.g. 'bfloat16 (auto: 1-token 22 ms vs 37 ms float32, …)'."""
    return loaded.dtype.describe() if loaded.dtype is not None else loaded.spec.target.dtype


def runtime_of(session) -> Optional[dict]:
    """{"device", "dtype", "quant", "sampler"} of a ChatSession; None for a session without a loaded pair."""
    loaded = session.loaded if session is not None else None
    if loaded is None:
        return None
    from localspec.verify import get_verifier

    sampler = get_verifier(session.default_spec().sampler, loaded.device)[0]  # what the next answer verifies with
    return {"device": str(loaded.device), "dtype": dtype_text(loaded), "quant": loaded.quant, "sampler": sampler}
