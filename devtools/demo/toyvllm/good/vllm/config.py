from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    model: str
    hf_config: object
    max_model_len: int
    dtype: str = "auto"
    enforce_eager: bool = False
    served_model_name: str = ""
    trust_remote_code: bool = False
    seed: int = 0

    @property
    def hf_text_config(self):
        return getattr(self.hf_config, "text_config", self.hf_config)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1

    @property
    def world_size(self):
        return self.tensor_parallel_size


@dataclass
class LoadConfig:
    load_format: str = "auto"


@dataclass
class CacheConfig:
    gpu_memory_utilization: float = 0.9
    block_size: int = 64


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256


@dataclass
class VllmConfig:
    model_config: ModelConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    load_config: LoadConfig = field(default_factory=LoadConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
