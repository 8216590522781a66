"""MLA decode kernels (toy: only their signatures)."""

KERNEL_VERSION = "@VERSION@"


def trtllm_batch_decode_with_kv_cache_mla(query, kv_cache, workspace, qk_nope_head_dim,
                                          kv_lora_rank, qk_rope_head_dim, block_tables,
                                          seq_lens, max_seq_len):
    raise NotImplementedError("toy build")
