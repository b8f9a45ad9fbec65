"""Holding greedy speculative output to the target path's stated guarantee (localspec/verify/guarantee.py)."""

import warnings

from localspec.verify.greedy_check import compare_greedy, first_difference
from localspec.verify.guarantee import guarantee_for_model


def assert_within_guarantee(session, prompt_ids, expected, got, label, exact=None, tree=False):
    """got equals expected, or first parts from it at a near-tie the path's measured flip bound allows (warned).
    exact: the forward setup whose guarantee applies (default: the session's); False for a reference that runs
    transformers' own forwards (generate)."""
    loaded = session.loaded
    exact = loaded.exact_on if exact is None else exact
    guarantee = guarantee_for_model(loaded.target, loaded.quant, loaded.device.type, exact)
    if (guarantee.tree_greedy if tree else guarantee.greedy) == "identical":  # bitwise equal: no bound, no flip
        assert got == expected, f"{label}: {guarantee.path} is bitwise identical, yet {compare_detail(got, expected)}"
        return
    assert guarantee.measured, f"{guarantee.path} has no measured bound: measure it (localspec bench rounding)"
    result = compare_greedy(loaded.target, prompt_ids, expected, got, guarantee, tree)
    assert result.ok, f"{label}: {result.detail}"
    if result.at is not None:
        warnings.warn(f"{label}: {result.detail}", stacklevel=2)


def compare_detail(got, expected) -> str:
    at = first_difference(expected, got)
    return f"the answers part at token {at}: {got[at : at + 3]} vs plain {expected[at : at + 3]}"
