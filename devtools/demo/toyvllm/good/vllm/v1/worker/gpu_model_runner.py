import time

from vllm.logger import init_logger
from vllm.model_executor.model_loader import get_model_loader

logger = init_logger(__name__)


class GPUModelRunner:
    def __init__(self, vllm_config, device):
        self.vllm_config = vllm_config
        self.device = device
        self.model = None

    def load_model(self):
        mc = self.vllm_config.model_config
        logger.info("Starting to load model %s...", mc.model)
        start = time.perf_counter()
        loader = get_model_loader(self.vllm_config.load_config)
        self.model = loader.load_model(vllm_config=self.vllm_config, model_config=mc)
        logger.info("Model loading took %.4f GiB memory and %.6f seconds",
                    self.model.num_parameters() * 0.5 / 2**30, time.perf_counter() - start)

    def execute_model(self, prompt, max_tokens):
        seed = sum(map(ord, prompt))
        return [(seed * 31 + i * 7) % 163840 for i in range(max_tokens)]
