from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.logger import init_logger

logger = init_logger(__name__)


class FusedMoE:
    def __init__(self, num_experts, top_k, hidden_size, intermediate_size, quant_config=None,
                 prefix="", n_group=1, topk_group=1):
        tp_size = get_tensor_model_parallel_world_size()
        if top_k > num_experts:
            raise ValueError(f"top_k ({top_k}) must not exceed the number of experts ({num_experts})")
        if n_group and num_experts % n_group:
            raise ValueError(f"num_experts ({num_experts}) must be divisible by n_group ({n_group})")
        self.num_experts = num_experts
        self.top_k = top_k
        self.intermediate_size_per_partition = intermediate_size // tp_size
        self.hidden_size = hidden_size
        self.quant_method = ("ModelOptNvFp4FusedMoE" if quant_config and
                             quant_config.get_quant_method(self, prefix) != "unquantized" else "UnquantizedFusedMoEMethod")
        if get_tensor_model_parallel_rank() == 0 and prefix.endswith("layers.1.mlp.experts"):
            logger.info("Using %s for %d experts (top-%d) in %s", self.quant_method, num_experts, top_k, prefix)

    def num_parameters(self):
        return self.num_experts * 3 * self.hidden_size * self.intermediate_size_per_partition
