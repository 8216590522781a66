from vllm.logger import init_logger
from vllm.model_executor.model_loader.utils import initialize_model

logger = init_logger(__name__)


class BaseModelLoader:
    def __init__(self, load_config):
        self.load_config = load_config

    def load_model(self, vllm_config, model_config):
        model = initialize_model(vllm_config=vllm_config, model_config=model_config)
        self.load_weights(model, model_config)
        return model
