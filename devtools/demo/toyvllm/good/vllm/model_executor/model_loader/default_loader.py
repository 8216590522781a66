import time

from vllm import envs
from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.weight_utils import filter_files_not_needed_for_inference

logger = init_logger(__name__)


class DefaultModelLoader(BaseModelLoader):
    def load_weights(self, model, model_config):
        start = time.perf_counter()
        files = filter_files_not_needed_for_inference(
            [f"model-{i:05d}-of-00064.safetensors" for i in range(1, 65)])
        time.sleep(envs.VLLM_TOY_LOAD_SECONDS)
        logger.info("Loading weights took %.2f seconds (%d shards)",
                    time.perf_counter() - start, len(files))
