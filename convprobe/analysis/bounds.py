"""Rounding-error bounds for a length-k dot product (one conv output: k = C_in*kh*kw).

All bounds are relative to sum_i |x_i y_i|, the quantity they bound
|fl(x^T y) - x^T y| by; for data of one sign that sum is |x^T y| itself.

- `gamma`: the deterministic worst case of k roundings (Higham 2002).
- `probabilistic_bound`: lambda*sqrt(k)*u, which holds with high probability
  when rounding errors are independent and mean zero (Higham & Mary 2019).
- `blocked_fma_bound`: accumulation in blocks of b exact products, as in GPU
  tensor cores (Blanchard, Higham, Lopez, Mary & Pranesh 2020).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from convprobe.errors import InvalidArgument, invalid_choice, is_integer
from convprobe.formats import Format, parse_format

__all__ = [
    "DEFAULT_LAMBDA",
    "BOUND_KINDS",
    "gamma",
    "probabilistic_bound",
    "probabilistic_confidence",
    "dot_probabilistic_confidence",
    "blocked_fma_bound",
    "dot_error_bound",
]

#: Default lambda of the probabilistic bound: each bound on k roundings then holds
#: with probability P(3) = 1 - 2 exp(-4.5 (1-u)^2) ~= 0.978 (see `probabilistic_confidence`).
DEFAULT_LAMBDA = 3.0

BoundKind = Literal["deterministic", "probabilistic", "blocked"]

BOUND_KINDS: tuple[BoundKind, ...] = ("deterministic", "probabilistic", "blocked")


def _check_k(k: object, argument: str = "k") -> np.ndarray:
    arr = np.asarray(k)
    if arr.dtype.kind not in "iuf" or arr.size == 0:
        raise InvalidArgument(f"{argument} must be a positive integer or array of them; received {k!r}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 1) or np.any(arr != np.floor(arr)):
        raise InvalidArgument(f"{argument} must be a positive integer or array of them; received {k!r}")
    return arr.astype(np.float64)


def _check_u(u: object, argument: str = "u") -> float:
    try:
        value = float(u)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{argument} must be a unit roundoff in (0, 1); received {u!r}") from exc
    if not 0.0 < value < 1.0:
        raise InvalidArgument(f"{argument} must be a unit roundoff in (0, 1); received {u!r}")
    return value


def _out(result: np.ndarray, like: object) -> float | np.ndarray:
    return float(result) if np.asarray(like).ndim == 0 else result


def gamma(k: object, u: float) -> float | np.ndarray:
    """gamma_k = k u / (1 - k u), the bound |theta_k| <= gamma_k on k roundings.

    Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed. (SIAM 2002),
    §3.1, Lemma 3.1; by (3.5), |fl(x^T y) - x^T y| <= gamma_k sum |x_i y_i| in
    any order. Defined only for k u < 1: raises InvalidArgument otherwise (for
    fp16, k >= 2048 gives no deterministic information at all).
    """
    ks = _check_k(k)
    uu = _check_u(u)
    ku = ks * uu
    if np.any(ku >= 1.0):
        worst = float(ks[ku >= 1.0].min())
        raise InvalidArgument(
            f"gamma_k needs k*u < 1; received k={worst:g}, u={uu!r} (k*u={worst * uu:g})"
        )
    return _out(ku / (1.0 - ku), k)


def probabilistic_bound(
    k: object, u: float, lam: float = DEFAULT_LAMBDA, *, first_order: bool = True
) -> float | np.ndarray:
    """lambda sqrt(k) u: the probabilistic counterpart of gamma_k.

    Higham & Mary, "A new approach to probabilistic rounding error analysis",
    SIAM J. Sci. Comput. 41(5), 2019, A2815-A2835, §3: if the k rounding errors
    are independent, mean zero random variables bounded by u, then |theta_k| <=
    gamma~_k(lambda) = exp(lambda sqrt(k) u + k u^2/(1-u)) - 1 = lambda sqrt(k) u
    + O(u^2) with probability at least P(lambda) = 1 - 2 exp(-lambda^2 (1-u)^2/2)
    (`probabilistic_confidence`); for a dot product every one of the k terms
    must satisfy it (§4), see `dot_probabilistic_confidence`. `first_order=False`
    returns gamma~_k(lambda) itself.
    """
    ks = _check_k(k)
    uu = _check_u(u)
    lam_value = float(lam)
    if not lam_value > 0.0 or not math.isfinite(lam_value):
        raise InvalidArgument(f"lam must be a positive number; received {lam!r}")
    if first_order:
        result = lam_value * np.sqrt(ks) * uu
    else:
        result = np.expm1(lam_value * np.sqrt(ks) * uu + ks * uu * uu / (1.0 - uu))
    return _out(result, k)


def probabilistic_confidence(lam: float = DEFAULT_LAMBDA, u: float = 2.0**-11) -> float:
    """P(lambda) = 1 - 2 exp(-lambda^2 (1-u)^2 / 2), clipped at 0 (Higham & Mary 2019, §3).

    The probability with which one product of k rounding factors obeys
    `probabilistic_bound`. lambda = 1 gives nothing (P < 0); lambda = 3 gives
    about 0.978; lambda = 5 about 0.999993.
    """
    uu = _check_u(u)
    return max(0.0, 1.0 - 2.0 * math.exp(-(float(lam) ** 2) * (1.0 - uu) ** 2 / 2.0))


def dot_probabilistic_confidence(k: int, lam: float = DEFAULT_LAMBDA, u: float = 2.0**-11) -> float:
    """Q(lambda, k) = 1 - k (1 - P(lambda)), clipped at 0 (Higham & Mary 2019, §4, inner products).

    A union bound over the k terms of the dot product: the probability with
    which the dot-product bound lambda sqrt(k) u sum|x_i y_i| holds in the model.
    """
    ks = _check_k(k)
    return max(0.0, 1.0 - float(ks.max()) * (1.0 - probabilistic_confidence(lam, u)))


def blocked_fma_bound(
    k: object,
    u: float,
    block_size: int,
    *,
    u_internal: float = 0.0,
    u_input: float = 0.0,
) -> float | np.ndarray:
    """Bound for a dot product accumulated by a block FMA, relative to sum |x_i y_i|.

    Model of Blanchard, Higham, Lopez, Mary & Pranesh, "Mixed precision block
    fused multiply-add: error analysis and application to GPU tensor cores",
    SIAM J. Sci. Comput. 42(3), 2020, C124-C141 (§2 block FMA model, §3 error
    analysis of matrix multiplication built from it): the k products are taken
    b = block_size at a time and computed exactly; each block FMA adds its b
    products and the running sum with additions of unit roundoff `u_internal`
    (0: exactly, as a true fused operation) and rounds its output to the
    accumulator, unit roundoff `u`; inputs are first rounded with `u_input`
    (0 when they are already in the low precision). With q = ceil(k/b) block
    steps a term suffers at most q output roundings and b*q internal ones, so

        |error| <= [(1 + u_input)^2 (1 + gamma_{bq}(u_internal)) (1 + gamma_q(u)) - 1] sum|x_i y_i|
                 = 2 u_input + (k/b) u + k u_internal + O(u^2),

    the paper's first-order structure (the (n/b) u_out term is what makes the
    fp32-output "TC32" variant far more accurate than "TC16"). b = 1 with
    u_internal = 0 gives gamma_k(u), the scalar FMA chain.
    """
    ks = _check_k(k)
    if not is_integer(block_size) or block_size < 1:
        raise InvalidArgument(f"block_size must be a positive integer; received {block_size!r}")
    uu = _check_u(u)
    for name, value in (("u_internal", u_internal), ("u_input", u_input)):
        if not 0.0 <= float(value) < 1.0:
            raise InvalidArgument(f"{name} must be in [0, 1); received {value!r}")
    q = np.ceil(ks / block_size)
    outer = np.asarray(gamma(q, uu))
    inner = np.asarray(gamma(q * block_size, u_internal)) if u_internal > 0.0 else 0.0
    a = 2.0 * float(u_input) + float(u_input) ** 2  # (1 + u_input)^2 - 1
    b, c = inner, outer
    # (1+a)(1+b)(1+c) - 1 expanded, so that b = c = 0 ... gives c exactly (no 1 + x - 1).
    result = c + b + a + b * c + a * (b + c) + a * b * c
    return _out(np.asarray(result, dtype=np.float64), k)


def dot_error_bound(
    k: object,
    fmt: str | Format,
    kind: BoundKind = "deterministic",
    *,
    lam: float | None = None,
    block_size: int | None = None,
    internal: str | Format | None = None,
    output: str | Format | None = None,
) -> float | np.ndarray:
    """Bound on |computed - exact| / sum |x_i y_i| for a length-k dot product accumulated in `fmt`.

    kind: "deterministic" (`gamma`), "probabilistic" (`probabilistic_bound`
    with `lam`, `DEFAULT_LAMBDA` when None), or "blocked" (`blocked_fma_bound` with
    `block_size` and the `internal` addition format, None = exact); a keyword that
    `kind` does not read is refused, not ignored. `output`: the format the result
    is finally stored in, when narrower than the accumulator (fp32 accumulation,
    fp16 output); its one rounding adds u_out + (1 + u_out) * bound, because
    |x^T y| <= sum|x_i y_i|.
    """
    if kind not in BOUND_KINDS:
        raise invalid_choice("kind", kind, BOUND_KINDS)
    for keyword, value, reader in (("lam", lam, "probabilistic"), ("block_size", block_size, "blocked"),
                                   ("internal", internal, "blocked")):
        if value is not None and kind != reader:
            raise InvalidArgument(f"{keyword} applies to kind={reader!r}; received {keyword}={value!r} with "
                                  f"kind={kind!r}")
    acc = parse_format(fmt, argument="fmt")
    u = acc.unit_roundoff
    if kind == "deterministic":
        bound = np.asarray(gamma(k, u))
    elif kind == "probabilistic":
        bound = np.asarray(probabilistic_bound(k, u, DEFAULT_LAMBDA if lam is None else lam))
    else:
        if block_size is None:
            raise InvalidArgument("block_size is required when kind is 'blocked'")
        u_int = 0.0 if internal is None else parse_format(internal, argument="internal").unit_roundoff
        bound = np.asarray(blocked_fma_bound(k, u, block_size, u_internal=u_int))
    if output is not None:
        u_out = parse_format(output, argument="output").unit_roundoff
        bound = u_out + (1.0 + u_out) * bound
    return _out(np.asarray(bound, dtype=np.float64), k)
