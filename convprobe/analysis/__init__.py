"""Analysis: error metrics, rounding-error bounds, tidy tables and figures.

Metrics and bounds are NumPy only; `tables` needs pandas and `figures`
matplotlib, imported when those submodules are first used.
"""

from convprobe.analysis.metrics import (
    ULP_DISTANCE_MAX,
    fraction_correctly_rounded,
    fraction_different,
    max_abs_diff,
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
    "ULP_DISTANCE_MAX",
    "fraction_correctly_rounded",
    "fraction_different",
    "max_abs_diff",
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
]
