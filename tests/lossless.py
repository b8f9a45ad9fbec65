"""Holding greedy speculative output to the target path's stated guarantee (localspec/verify/guarantee.py)."""

import warnings

from localspec.verify.greedy_check import compare_greedy
from localspec.verify.guarantee import guarantee_for_model


def assert_within_guarantee(session, prompt_ids, expected, got, label):
    """got equals expected, or first parts from it at a near-tie the path's measured flip bound allows (warned)."""
    loaded = session.loaded
    guarantee = guarantee_for_model(loaded.target, loaded.quant, loaded.device.type)
    assert guarantee.measured, f"{guarantee.path} has no measured bound: measure it (scripts/measure_rounding.py)"
    result = compare_greedy(loaded.target, prompt_ids, expected, got, guarantee)
    assert result.ok, f"{label}: {result.detail}"
    if result.at is not None:
        warnings.warn(f"{label}: {result.detail}", stacklevel=2)
