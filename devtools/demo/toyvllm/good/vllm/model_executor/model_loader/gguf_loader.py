from vllm.model_executor.model_loader.base_loader import BaseModelLoader


class GGUFModelLoader(BaseModelLoader):
    """Model loader that can load GGUF files."""

    def _get_gguf_weights_map(self, model_config):
        return {}

    def load_weights(self, model, model_config):
        raise NotImplementedError("GGUF checkpoints are not part of the toy build")
