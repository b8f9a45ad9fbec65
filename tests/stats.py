"""Chi-square goodness of fit: the implementation lives in the package (shared with `localspec selftest`)."""

from localspec.verify.checks import chi_square_p  # noqa: F401
