"""Analysis: error metrics, rounding-error bounds, tidy tables and figures.

`metrics` and `bounds` are NumPy only. `tables` (pandas) and `figures`
(matplotlib) are imported on first use, so `import convprobe.analysis` stays
light: `from convprobe.analysis import figures`.
"""

from convprobe.analysis.bounds import (
    BOUND_KINDS,
    DEFAULT_LAMBDA,
    blocked_fma_bound,
    dot_error_bound,
    dot_probabilistic_confidence,
    gamma,
    probabilistic_bound,
    probabilistic_confidence,
)
from convprobe.analysis.metrics import (
    ULP_DISTANCE_MAX,
    abs_sum_error,
    fraction_correctly_rounded,
    fraction_different,
    max_abs_diff,
    max_abs_sum_error,
    max_relative_error,
    median_relative_error,
    relative_error,
    relative_norm_error,
    round_nearest_even,
    special_counts,
    summarize,
    ulp,
    ulp_distance,
    ulp_error,
)

__all__ = [
    # metrics
    "ULP_DISTANCE_MAX",
    "abs_sum_error",
    "fraction_correctly_rounded",
    "fraction_different",
    "max_abs_diff",
    "max_abs_sum_error",
    "max_relative_error",
    "median_relative_error",
    "relative_error",
    "relative_norm_error",
    "round_nearest_even",
    "special_counts",
    "summarize",
    "ulp",
    "ulp_distance",
    "ulp_error",
    # bounds
    "BOUND_KINDS",
    "DEFAULT_LAMBDA",
    "blocked_fma_bound",
    "dot_error_bound",
    "dot_probabilistic_confidence",
    "gamma",
    "probabilistic_bound",
    "probabilistic_confidence",
]
