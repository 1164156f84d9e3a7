"""Analysis: error metrics, rounding-error bounds, tidy tables and figures.

`metrics` and `bounds` are NumPy only and imported eagerly. The names of
`tables` (pandas) and `figures` (matplotlib) are re-exported lazily: they are
imported on first access, so the probes and the TensorFlow worker, which import
this package for its metrics, never pay for pandas or matplotlib.
"""

from importlib import import_module

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

_LAZY = {
    "TABLE_SCHEMA_VERSION": "tables",
    "STATUSES": "tables",
    "Column": "tables",
    "Schema": "tables",
    "SWEEP_SCHEMA": "tables",
    "PROBE_SCHEMA": "tables",
    "SCHEMAS": "tables",
    "validate_frame": "tables",
    "frame_from_records": "tables",
    "empty_frame": "tables",
    "read_table": "tables",
    "write_table": "tables",
    "add_bounds": "tables",
    "fingerprint_table": "tables",
    "error_vs_k_figure": "figures",
    "ulp_histogram_figure": "figures",
    "table_figure": "figures",
    "DEFAULT_HIGHLIGHT": "figures",
}


def __getattr__(name: str):
    """Import `tables`/`figures` names on first use (PEP 562)."""
    if name in _LAZY:
        value = getattr(import_module(f"convprobe.analysis.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    if name in ("tables", "figures"):
        return import_module(f"convprobe.analysis.{name}")
    raise AttributeError(f"module 'convprobe.analysis' has no attribute {name!r}")


__all__ = [  # noqa: PLE0604 - _LAZY holds names (strings) too
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
    # tables and figures (lazy)
    *_LAZY,
]
