from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                             get_tensor_model_parallel_world_size)
