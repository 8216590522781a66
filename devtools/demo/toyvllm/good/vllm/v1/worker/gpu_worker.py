from vllm.logger import init_logger
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = init_logger(__name__)


class Worker:
    def __init__(self, vllm_config, local_rank, rank):
        self.vllm_config = vllm_config
        self.local_rank = local_rank
        self.rank = rank
        self.model_runner = None

    def init_device(self):
        # The toy has no GPU: each rank pretends to own device `local_rank`.
        self.device = f"cuda:{self.local_rank}"
        self.model_runner = GPUModelRunner(self.vllm_config, self.device)

    def load_model(self):
        self.model_runner.load_model()

    def determine_num_blocks(self):
        util = self.vllm_config.cache_config.gpu_memory_utilization
        return int(2048 * util)

    def execute_model(self, prompt, max_tokens):
        return self.model_runner.execute_model(prompt, max_tokens)
