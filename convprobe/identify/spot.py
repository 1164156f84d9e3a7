"""Where a conv layer's crafted rows are read: the output, input position or tap whose
window lies wholly inside the image (`layer_patterns` places the rows there,
`column_patterns` reads every column at it)."""

from __future__ import annotations

from convprobe.probes.layers import Layer

__all__ = ["spot"]


def _first(candidates, valid) -> int | None:
    return next((c for c in candidates if all(valid(c))), None)


def spot(layer: Layer, op: str) -> tuple[int, int] | None:
    """Where the crafted rows are read: a forward output (or, for the input gradient, an
    input position) whose window lies wholly inside the image, or for the filter gradient a
    tap that every output reads inside it. None if the layer has none."""
    spots = []
    for size, k, out, s, d, top in layer.dimensions:
        if op == "conv2d":
            spots.append(_first(range(out), lambda o: (0 <= o * s - top + t * d < size for t in range(k))))
        elif op == "conv2d_backprop_input":  # stride 1: dx[i] reads dy[i + top - t*d]
            spots.append(_first(range(size), lambda i: (0 <= i + top - t * d < out for t in range(k))))
        else:
            spots.append(_first(range(k), lambda t: (0 <= o * s - top + t * d < size for o in range(out))))
    if None in spots:
        return None
    h, w = spots[0], spots[1]
    assert h is not None and w is not None  # (no None in spots)
    return h, w
