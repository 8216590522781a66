from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config


def get_quantization_config(hf_config):
    qc = getattr(hf_config, "quantization_config", None)
    if not qc:
        return None
    if qc.get("quant_method") == "modelopt" and qc.get("quant_algo") == "NVFP4":
        return ModelOptNvFp4Config(qc)
    raise ValueError(f"Unknown quantization method: {qc.get('quant_method')!r}")
