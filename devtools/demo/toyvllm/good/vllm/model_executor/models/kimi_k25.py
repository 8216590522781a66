"""Kimi-K2.5: a vision tower in front of a DeepSeek-V3 language model."""

import copy

from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM


class KimiK25ForConditionalGeneration:
    def __init__(self, *, vllm_config, prefix=""):
        hf_config = vllm_config.model_config.hf_config
        self.vision_layers = getattr(getattr(hf_config, "vision_config", None), "num_hidden_layers", 0)
        self.language_model = DeepseekV3ForCausalLM(
            vllm_config=vllm_config, hf_config=hf_config.text_config,
            prefix=f"{prefix}language_model")

    def num_parameters(self):
        return self.language_model.num_parameters()
