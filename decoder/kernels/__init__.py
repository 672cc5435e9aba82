"""Native and few-row kernels: a draft level's bookkeeping (numba), skinny linears, a mapped draft vocabulary."""
