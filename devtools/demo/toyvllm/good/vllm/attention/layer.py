from vllm.distributed import get_tensor_model_parallel_rank
from vllm.logger import init_logger

logger = init_logger(__name__)
_announced = False


class MLAAttention:
    """Multi-head latent attention over the paged KV cache."""

    def __init__(self, num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                 q_lora_rank, kv_lora_rank, prefix=""):
        global _announced
        if num_heads <= 0:
            raise ValueError(f"MLAAttention needs at least one head, got {num_heads} ({prefix})")
        self.num_heads = num_heads
        self.scale = scale
        self.kv_lora_rank = kv_lora_rank
        self.head_size = kv_lora_rank + qk_rope_head_dim
        self.backend = "FLASHINFER_MLA"
        if not _announced:
            _announced = True
            import flashinfer
            logger.info("Using %s attention backend (flashinfer %s) on rank %d", self.backend,
                        flashinfer.__version__, get_tensor_model_parallel_rank())
