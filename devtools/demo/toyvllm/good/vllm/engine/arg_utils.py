from dataclasses import dataclass

from vllm.config import (CacheConfig, LoadConfig, ModelConfig, ParallelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.transformers_utils.config import get_config, get_hf_text_config

LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy", "gguf")


@dataclass
class EngineArgs:
    model: str = "facebook/opt-125m"
    tokenizer: str = None
    trust_remote_code: bool = False
    revision: str = None
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    quantization: str = None
    seed: int = 0
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    max_model_len: int = None
    max_num_seqs: int = None
    load_format: str = "auto"
    hf_overrides: dict = None
    served_model_name: str = None
    kv_cache_dtype: str = "auto"

    def create_engine_config(self):
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"Unknown load format {self.load_format!r}; choose from {LOAD_FORMATS}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        hf_config = get_config(self.model, self.trust_remote_code, self.revision, self.hf_overrides)
        text = get_hf_text_config(hf_config)
        limit = getattr(text, "max_position_embeddings", 4096)
        max_len = self.max_model_len or limit
        if max_len > limit:
            raise ValueError(f"User-specified max_model_len ({max_len}) is greater than the derived "
                             f"max_model_len (max_position_embeddings={limit} in model's config.json).")
        model = ModelConfig(model=self.model, hf_config=hf_config, max_model_len=max_len,
                            dtype=self.dtype, enforce_eager=self.enforce_eager,
                            served_model_name=self.served_model_name or self.model,
                            trust_remote_code=self.trust_remote_code, seed=self.seed)
        return VllmConfig(model_config=model,
                          parallel_config=ParallelConfig(self.tensor_parallel_size),
                          load_config=LoadConfig(self.load_format),
                          cache_config=CacheConfig(self.gpu_memory_utilization),
                          scheduler_config=SchedulerConfig(self.max_num_seqs or 256))
