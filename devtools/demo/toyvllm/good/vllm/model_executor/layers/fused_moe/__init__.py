from vllm.model_executor.layers.fused_moe.layer import FusedMoE
