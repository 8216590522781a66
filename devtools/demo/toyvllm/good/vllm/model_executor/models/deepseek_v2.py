"""Inference-only DeepseekV2/DeepseekV3 model (toy build: shapes and wiring, no tensors)."""

from vllm.attention.layer import MLAAttention
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.linear import (ColumnParallelLinear, ReplicatedLinear,
                                               RowParallelLinear)
from vllm.model_executor.layers.quantization import get_quantization_config
logger = init_logger(__name__)


class DeepseekV2MLP:
    def __init__(self, hidden_size, intermediate_size, quant_config=None, prefix=""):
        self.gate_up_proj = ColumnParallelLinear(hidden_size, 2 * intermediate_size, quant_config,
                                                 prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, quant_config,
                                           prefix=f"{prefix}.down_proj")

    def num_parameters(self):
        return self.gate_up_proj.num_parameters() + self.down_proj.num_parameters()


class DeepseekV2MoE:
    def __init__(self, config, quant_config=None, prefix=""):
        self.n_routed_experts = config.n_routed_experts
        self.gate = ReplicatedLinear(config.hidden_size, config.n_routed_experts, None,
                                     prefix=f"{prefix}.gate")
        self.experts = FusedMoE(num_experts=config.n_routed_experts,
                                top_k=config.num_experts_per_tok,
                                hidden_size=config.hidden_size,
                                intermediate_size=config.moe_intermediate_size,
                                quant_config=quant_config, prefix=f"{prefix}.experts",
                                n_group=getattr(config, "n_group", 1),
                                topk_group=getattr(config, "topk_group", 1))
        self.shared_experts = None
        if getattr(config, "n_shared_experts", 0):
            self.shared_experts = DeepseekV2MLP(
                config.hidden_size, config.moe_intermediate_size * config.n_shared_experts,
                quant_config, prefix=f"{prefix}.shared_experts")

    def num_parameters(self):
        n = self.experts.num_parameters()
        return n + (self.shared_experts.num_parameters() if self.shared_experts else 0)


class DeepseekV2MLAAttention:
    """Multi-head latent attention (DeepSeek-V2 paper, section 2.1)."""

    def __init__(self, vllm_config, config, hidden_size, num_heads, qk_nope_head_dim,
                 qk_rope_head_dim, v_head_dim, q_lora_rank, kv_lora_rank,
                 max_position_embeddings=8192, quant_config=None, prefix=""):
        self.hidden_size = hidden_size
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.num_heads = num_heads
        tp_size = get_tensor_model_parallel_world_size()
        assert num_heads % tp_size == 0
        self.num_local_heads = num_heads // tp_size
        self.scaling = self.qk_head_dim ** -0.5

        if self.q_lora_rank is not None:
            self.fused_qkv_a_proj = ReplicatedLinear(
                hidden_size, q_lora_rank + kv_lora_rank + qk_rope_head_dim, quant_config,
                prefix=f"{prefix}.fused_qkv_a_proj")
            self.q_b_proj = ColumnParallelLinear(q_lora_rank, num_heads * self.qk_head_dim,
                                                 quant_config, prefix=f"{prefix}.q_b_proj")
        else:
            self.q_proj = ColumnParallelLinear(hidden_size, num_heads * self.qk_head_dim,
                                               quant_config, prefix=f"{prefix}.q_proj")
        self.kv_b_proj = ColumnParallelLinear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim),
                                              quant_config, prefix=f"{prefix}.kv_b_proj")
        self.o_proj = RowParallelLinear(num_heads * v_head_dim, hidden_size, quant_config,
                                        prefix=f"{prefix}.o_proj")
        self.mla_attn = MLAAttention(
            num_heads=self.num_local_heads, scale=self.scaling, qk_nope_head_dim=qk_nope_head_dim,
            qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim, q_lora_rank=q_lora_rank,
            kv_lora_rank=kv_lora_rank, prefix=f"{prefix}.attn")

    def num_parameters(self):
        return self.kv_b_proj.num_parameters() + self.o_proj.num_parameters()


class DeepseekV2DecoderLayer:
    def __init__(self, vllm_config, config, prefix, quant_config=None):
        self.hidden_size = config.hidden_size
        layer_idx = int(prefix.split(sep=".")[-1])
        self.layer_idx = layer_idx
        attn_cls = DeepseekV2MLAAttention
        self.self_attn = attn_cls(
            vllm_config=vllm_config,
            config=config,
            hidden_size=self.hidden_size,
            num_heads=config.num_attention_heads,
            qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim,
            v_head_dim=config.v_head_dim,
            q_lora_rank=getattr(config, "q_lora_rank", None),
            kv_lora_rank=config.kv_lora_rank,
            max_position_embeddings=getattr(config, "max_position_embeddings", 8192),
            quant_config=quant_config,
            prefix=f"{prefix}.self_attn",
        )
        if (config.n_routed_experts is not None
                and layer_idx >= config.first_k_dense_replace
                and layer_idx % getattr(config, "moe_layer_freq", 1) == 0):
            self.mlp = DeepseekV2MoE(config=config, quant_config=quant_config, prefix=f"{prefix}.mlp")
        else:
            self.mlp = DeepseekV2MLP(config.hidden_size, config.intermediate_size, quant_config,
                                     prefix=f"{prefix}.mlp")

    def num_parameters(self):
        return self.self_attn.num_parameters() + self.mlp.num_parameters()


class DeepseekV2Model:
    def __init__(self, *, vllm_config, config, quant_config=None, prefix=""):
        self.vocab_size = config.vocab_size
        self.layers = [DeepseekV2DecoderLayer(vllm_config, config, f"{prefix}.layers.{i}", quant_config)
                       for i in range(config.num_hidden_layers)]

    def num_parameters(self):
        return self.vocab_size * 7168 + sum(layer.num_parameters() for layer in self.layers)


class DeepseekV2ForCausalLM:
    def __init__(self, *, vllm_config, prefix="", hf_config=None):
        config = hf_config or vllm_config.model_config.hf_text_config
        quant_config = get_quantization_config(vllm_config.model_config.hf_config)
        self.config = config
        self.model = DeepseekV2Model(vllm_config=vllm_config, config=config,
                                     quant_config=quant_config,
                                     prefix=f"{prefix}.model" if prefix else "model")
        if get_tensor_model_parallel_rank() == 0:
            logger.info("%s: %d decoder layers (%d dense, %d MoE)", type(self).__name__,
                        len(self.model.layers),
                        sum(isinstance(l.mlp, DeepseekV2MLP) for l in self.model.layers),
                        sum(isinstance(l.mlp, DeepseekV2MoE) for l in self.model.layers))

    def num_parameters(self):
        return self.model.num_parameters()


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    pass
