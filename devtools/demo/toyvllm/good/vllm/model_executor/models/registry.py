import importlib

_MODELS = {
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM"),
    "KimiK25ForConditionalGeneration": ("kimi_k25", "KimiK25ForConditionalGeneration"),
}


def resolve_model_cls(architectures):
    for arch in architectures or []:
        if arch in _MODELS:
            module, name = _MODELS[arch]
            return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)
    raise ValueError(f"Model architectures {architectures} are not supported for now. "
                     f"Supported architectures: {sorted(_MODELS)}")
