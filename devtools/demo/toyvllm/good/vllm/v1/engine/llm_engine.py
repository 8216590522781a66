import time

from vllm.logger import init_logger
from vllm.v1.engine.core_client import EngineCoreClient

logger = init_logger(__name__)


class LLMEngine:
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.engine_core = EngineCoreClient.make_client(vllm_config)

    @classmethod
    def from_engine_args(cls, engine_args):
        return cls(engine_args.create_engine_config())

    def generate(self, prompt, max_tokens):
        return self.engine_core.call("generate", prompt, max_tokens)

    def is_alive(self):
        return self.engine_core.is_alive()

    def shutdown(self):
        self.engine_core.shutdown()
