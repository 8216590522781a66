import os

VLLM_WORKER_MULTIPROC_METHOD = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork")
VLLM_ENGINE_READY_TIMEOUT_S = int(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))
# Seconds each worker pretends to spend loading (dummy) weights.
VLLM_TOY_LOAD_SECONDS = float(os.environ.get("VLLM_TOY_LOAD_SECONDS", "0.8"))
