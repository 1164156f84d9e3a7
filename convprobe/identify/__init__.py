"""identify's machinery: the battery and the layer mode, and every measurement behind
them. It imports `convprobe.probes` (the layers, the runner, the battery's encodings);
nothing in `convprobe.probes` imports it (the probe registry names `battery` by path).

- `battery` (a probe module: `run` in the child, `interpret`) and `battery_study`
  (`convprobe identify`'s battery call): seeded dot products per K and the best model.
- `structure`: the structure of a black-box sum read from crafted rows (accumulator,
  chunk starts, lanes, product rounding); `direct_sum`: whether the op is a direct sum
  of products at all.
- `layer_identify`: the layer mode, a probe module of its own (`run` in the child,
  `interpret`, `identify_observed`), run by module path from `layer_study`
  (`convprobe identify`'s layer call).
- `layer_patterns`: crafted rows in a layer's three ops, read at their `spot`;
  `column_patterns` and `tile_patterns` measure the GEMM's columns and tiles;
  `batch_order` and `input_gradient_layout` measure an op laid out the other way, and
  `depthwise_as_grouped` runs a depthwise op as the grouped conv2d it is (`rewritten_calls`
  is their frame).
- The summation tree recovered from crafted sums (`tree_recovery`), the formats of its
  additions (`tree_formats`) and its placement in a conv layer's ops (`layer_trees`):
  these work from the op alone, whatever its kernel.
"""
