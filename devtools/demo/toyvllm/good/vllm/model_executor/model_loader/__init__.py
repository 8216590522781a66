from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader


def get_model_loader(load_config):
    if load_config.load_format == "dummy":
        return DummyModelLoader(load_config)
    return DefaultModelLoader(load_config)
