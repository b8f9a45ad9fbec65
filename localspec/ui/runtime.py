"""What the loaded pair runs on, as data for the stats panel header: device, dtype, quantization, sampler kernel."""
from __future__ import annotations

from typing import Optional


def runtime_of(session) -> Optional[dict]:
    """{"device", "dtype", "quant", "sampler"} of a ChatSession; None for a session without a loaded pair."""
    loaded = session.loaded if session is not None else None
    if loaded is None:
        return None
    from localspec.verify import get_verifier

    sampler = get_verifier(session.default_spec().sampler, loaded.device)[0]  # what the next answer verifies with
    return {"device": str(loaded.device), "dtype": loaded.spec.target.dtype, "quant": loaded.quant,
            "sampler": sampler}
