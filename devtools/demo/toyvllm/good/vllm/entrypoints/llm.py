import time

from vllm.engine.arg_utils import EngineArgs
from vllm.logger import init_logger
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

logger = init_logger(__name__)


class LLM:
    """An LLM for offline inference (same constructor arguments as vLLM's)."""

    def __init__(self, model, *, tokenizer=None, trust_remote_code=False,
                 tensor_parallel_size=1, dtype="auto", quantization=None, revision=None,
                 seed=0, gpu_memory_utilization=0.9, enforce_eager=False,
                 max_model_len=None, load_format="auto", hf_overrides=None, **kwargs):
        engine_args = EngineArgs(
            model=model, tokenizer=tokenizer, trust_remote_code=trust_remote_code,
            tensor_parallel_size=tensor_parallel_size, dtype=dtype, quantization=quantization,
            revision=revision, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager, max_model_len=max_model_len, load_format=load_format,
            hf_overrides=hf_overrides, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        self._request_counter = 0

    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        if isinstance(prompts, str):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        outputs = []
        for prompt in prompts:
            tokens = self.llm_engine.generate(prompt, params.max_tokens)
            outputs.append(RequestOutput(str(self._request_counter), prompt,
                                         [CompletionOutput(0, "".join(f" tok{t}" for t in tokens), tokens)]))
            self._request_counter += 1
        return outputs

    def shutdown(self):
        self.llm_engine.shutdown()

    def __del__(self):
        try:
            self.llm_engine.shutdown()
        except Exception:
            pass
