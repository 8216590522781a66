"""How MLA query heads are laid out across tensor-parallel ranks."""


def mla_head_range(num_heads, tp_size, tp_rank):
    """The query heads `tp_rank` owns. Ranks in the second half of the TP group take their
    heads mirrored, so that all-gathers pair GPUs across the two PCIe switches of 8-GPU
    hosts (rank 7 <-> heads of rank 4, rank 6 <-> rank 5, ...)."""
    per_rank = num_heads // tp_size
    half = tp_size // 2
    if tp_size < 2 or tp_rank < half:
        return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
    mirrored = tp_size + half - tp_rank
    start = mirrored * per_rank
    return range(start, min(start + per_rank, num_heads))
