from vllm.logger import init_logger

logger = init_logger(__name__)


class ModelOptNvFp4Config:
    def __init__(self, config):
        self.group_size = config.get("group_size", 16)
        self.exclude_modules = config.get("exclude_modules", [])
        logger.info("Detected ModelOpt NVFP4 checkpoint (group_size=%d)", self.group_size)

    def get_quant_method(self, layer, prefix):
        if any(prefix.startswith(m) or m in prefix for m in self.exclude_modules):
            return "unquantized"
        return "ModelOptNvFp4LinearMethod"
