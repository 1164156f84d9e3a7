"""convprobe's public pytest plugin (registered through the `pytest11` entry point).

Assertions (import from here):

    from convprobe.testing import (
        assert_accumulates_in, assert_ulp_close, assert_within_error_bound,
        assert_no_gradient_underflow, assert_all_finite,
    )

Fixtures (no import needed once convprobe is installed): `rng`, `conv_backend`;
markers: `gpu`, `tensorflow`, `conv_backends(...)`; options:
`--convprobe-backends`, `--convprobe-seed`. Hypothesis strategies live in
`convprobe.testing.strategies` (needs hypothesis, from the `test` extra).
"""

from convprobe.testing.assertions import (
    ACCUMULATIONS,
    BOUND_KINDS,
    UnderflowClass,
    assert_accumulates_in,
    assert_all_finite,
    assert_no_gradient_underflow,
    assert_ulp_close,
    assert_within_error_bound,
)
from convprobe.testing.backends import ConvBackend, available_configs, resolve_target

__all__ = [
    "ACCUMULATIONS",
    "BOUND_KINDS",
    "ConvBackend",
    "UnderflowClass",
    "assert_accumulates_in",
    "assert_all_finite",
    "assert_no_gradient_underflow",
    "assert_ulp_close",
    "assert_within_error_bound",
    "available_configs",
    "resolve_target",
]
