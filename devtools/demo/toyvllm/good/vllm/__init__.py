"""vLLM: a high-throughput and memory-efficient inference engine for LLMs (toy build)."""

from vllm.version import __version__, __version_tuple__
from vllm.sampling_params import SamplingParams
from vllm.entrypoints.llm import LLM

__all__ = ["LLM", "SamplingParams", "__version__", "__version_tuple__"]
