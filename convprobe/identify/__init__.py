"""identify's machinery that works from the op alone, whatever its kernel: the summation
tree recovered from crafted sums (`tree_recovery`) and its placement in a conv layer's
ops (`layer_trees`)."""
