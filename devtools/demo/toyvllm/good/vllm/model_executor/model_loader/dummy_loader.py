import time

from vllm import envs
from vllm.model_executor.model_loader.base_loader import BaseModelLoader


class DummyModelLoader(BaseModelLoader):
    """Random weights: init exercises every layer without reading a checkpoint."""

    def load_weights(self, model, model_config):
        time.sleep(envs.VLLM_TOY_LOAD_SECONDS)
