"""Chi-square goodness of fit without scipy (torch has the regularised incomplete gamma function)."""
import torch


def chi_square_p(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """p-value that `observed` counts come from `expected_probs`. Cells with expected count < 5 are pooled."""
    observed = observed.double()
    expected = expected_probs.double() * observed.sum()
    assert observed[expected_probs == 0].sum() == 0, "a token with zero target probability was emitted"
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = max(int(keep.sum()) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2.0))
