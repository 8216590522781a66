from vllm.model_executor.models.registry import resolve_model_cls


def initialize_model(vllm_config, model_config, prefix=""):
    model_class = resolve_model_cls(model_config.hf_config.architectures)
    return model_class(vllm_config=vllm_config, prefix=prefix)
