"""Large, realistic vLLM journals for benchmarking `rewheel why` (`make bench`).

`generate_log(path, size_bytes)` writes a journald-format log of a long-running vLLM
service (TP=8): startup, request and throughput chatter, /health probes, now and then a
handled warning-level traceback and a client-disconnect cascade, and at the end the
upgrade's crash loop — Worker_TP4 dying in deepseek_v2.py:998 — repeated over several
restarts. `run_benchmark(path)` times `analyse_file` against `grep -c Traceback`.
Run `python -m devtools.bench_logs [SIZE_MB]` for a quick measurement.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SP = "/root/ml-env/lib/python3.12/site-packages"
ROOT_MSG = "DeepseekV2MLAAttention.__init__() got an unexpected keyword argument 'topk_indices_buffer'"
CRASH_RESTARTS = 3


def _j(clock: str, pid: int, msg: str, ident: str = "vllm-kimi") -> str:
    return f"Feb 20 {clock} llm-two {ident}[{pid}]: {msg}\n"


def _hdr(level: str, src: str, clock: str) -> str:
    return f"{level} 02-20 {clock} [{src}] "


def _tb(frames: list[tuple[str, int, str, str]], exc: str) -> list[str]:
    out = ["Traceback (most recent call last):"]
    for file, line, func, src in frames:
        out += [f'  File "{file}", line {line}, in {func}', f"    {src}"]
    return out + [exc]


CRASH_FRAMES = [
    (f"{SP}/vllm/v1/executor/multiproc_executor.py", 743, "worker_main", "worker = WorkerProc(*args, **kwargs)"),
    (f"{SP}/vllm/v1/executor/multiproc_executor.py", 569, "__init__", "self.worker.load_model()"),
    (f"{SP}/vllm/v1/worker/gpu_worker.py", 273, "load_model", "self.model_runner.load_model(eep_scale_up=eep_scale_up)"),
    (f"{SP}/vllm/v1/worker/gpu_model_runner.py", 3460, "load_model", "self.model = model_loader.load_model("),
    (f"{SP}/vllm/model_executor/model_loader/utils.py", 48, "initialize_model",
     "return model_class(vllm_config=vllm_config, prefix=prefix)"),
    (f"{SP}/vllm/model_executor/models/deepseek_v2.py", 1290, "__init__",
     "self.start_layer, self.end_layer, self.layers = make_layers("),
    (f"{SP}/vllm/model_executor/models/deepseek_v2.py", 998, "__init__", "self.self_attn = attn_cls("),
]


def _chatter(rng: random.Random, clock: str, api: int) -> str:
    r = rng.random()
    if r < 0.45:
        return _j(clock, api, f"(APIServer pid={api}) INFO:     10.0.{rng.randint(0, 9)}.{rng.randint(2, 250)}:"
                  f"{rng.randint(30000, 60999)} - \"POST /v1/chat/completions HTTP/1.1\" 200 OK")
    if r < 0.65:
        return _j(clock, api, f"(APIServer pid={api}) INFO:     127.0.0.1:{rng.randint(30000, 60999)} - "
                  "\"GET /health HTTP/1.1\" 200 OK")
    if r < 0.85:
        return _j(clock, api, f"(APIServer pid={api}) " + _hdr("INFO", "loggers.py:123", clock)
                  + f"Engine 000: Avg prompt throughput: {rng.random() * 4000:.1f} tokens/s, Avg generation "
                  f"throughput: {rng.random() * 400:.1f} tokens/s, Running: {rng.randint(0, 64)} reqs, Waiting: "
                  f"{rng.randint(0, 9)} reqs, GPU KV cache usage: {rng.random() * 100:.1f}%, Prefix cache hit rate: "
                  f"{rng.random() * 100:.1f}%")
    if r < 0.97:
        return _j(clock, api, f"(APIServer pid={api}) " + _hdr("INFO", "logger.py:41", clock)
                  + f"Received request chatcmpl-{rng.getrandbits(64):016x}: prompt: '<|im_start|>user ...', "
                  f"params: SamplingParams(n=1, temperature=0.6, top_p=0.95, max_tokens={rng.randint(16, 8192)})")
    return _j(clock, api, f"(APIServer pid={api}) " + _hdr("WARNING", "protocol.py:93", clock)
              + "The following fields were present in the request but ignored: {'stream_options'}")


def _benign_traceback(rng: random.Random, clock: str, api: int) -> list[str]:
    """Handled noise seen on healthy servers: a warning-level traceback, or a cascade."""
    p = f"(APIServer pid={api}) "
    if rng.random() < 0.5:
        h = _hdr("WARNING", "serving_chat.py:1201", clock)
        lines = [p + h + "Error in chat template; falling back:"] + [p + h + ln for ln in _tb(
            [(f"{SP}/vllm/entrypoints/chat_utils.py", 1412, "apply_hf_chat_template", "return tokenizer.apply_chat_template(")],
            "jinja2.exceptions.TemplateError: Conversation roles must alternate user/assistant/user/assistant/...")]
    else:
        lines = [p + ln for ln in _tb(
            [(f"{SP}/vllm/entrypoints/openai/serving_chat.py", 611, "chat_completion_stream_generator",
              "async for res in result_generator:"),
             (f"{SP}/vllm/v1/engine/async_llm.py", 439, "generate", "out = q.get_nowait() or await q.get()")],
            "asyncio.exceptions.CancelledError")]
    return [_j(clock, api, ln) for ln in lines]


def _crash(api: int, clock: str, n: int) -> list[str]:
    eng, w0 = api + 6, api + 12
    out = [_j(clock, 1, "Started vllm-kimi-k25.service - vLLM Kimi-K2.5.", ident="systemd"),
           _j(clock, api, f"(APIServer pid={api}) " + _hdr("INFO", "api_server.py:1891", clock)
              + "vLLM API server version 0.16.0rc2.dev344+g5719a4e4e")]
    for r in range(8):
        out.append(_j(clock, api, f"(Worker_TP{r} pid={w0 + r}) " + _hdr("INFO", "gpu_model_runner.py:3338", clock)
                      + "Starting to load model moonshotai/Kimi-K2.5-NVFP4..."))
    p = f"(Worker_TP4 pid={w0 + 4}) "
    h = _hdr("ERROR", "multiproc_executor.py:783", clock)
    out.append(_j(clock, api, p + h + "WorkerProc failed to start."))
    out += [_j(clock, api, p + h + ln) for ln in _tb(CRASH_FRAMES, f"TypeError: {ROOT_MSG}")]
    for r in (0, 1, 2, 3, 5, 6, 7):
        out.append(_j(clock, api, f"(Worker_TP{r} pid={w0 + r}) " + _hdr("WARNING", "multiproc_executor.py:772", clock)
                      + "WorkerProc was terminated"))
    pe = f"(EngineCore_DP0 pid={eng}) "
    he = _hdr("ERROR", "core.py:866", clock)
    out += [_j(clock, api, pe + he + ln) for ln in ["EngineCore failed to start."] + _tb(
        [(f"{SP}/vllm/v1/executor/multiproc_executor.py", 660, "wait_for_ready", "raise e from None")],
        "Exception: WorkerProc initialization failed due to an exception in a background process. "
        "See stack trace for root cause.")]
    out += [_j(clock, api, f"(APIServer pid={api}) " + ln) for ln in _tb(
        [(f"{SP}/vllm/v1/engine/utils.py", 785, "wait_for_engine_startup", "raise RuntimeError(")],
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")]
    out.append(_j(clock, 1, "vllm-kimi-k25.service: Main process exited, code=exited, status=1/FAILURE", "systemd"))
    out.append(_j(clock, 1, f"vllm-kimi-k25.service: Scheduled restart job, restart counter is at {n + 1}.", "systemd"))
    return out


def generate_log(path: str | Path, size_bytes: int, *, seed: int = 20260220) -> dict[str, Any]:
    """Write a journal of about `size_bytes` to `path`; return what `why` must find in it:
    {"root_type", "root_message", "root_rank", "root_line", "root_frame_line", "restarts", "tracebacks"}."""
    rng = random.Random(seed)
    api = 216054
    crash_blocks = [_crash(300000 + 1000 * n, "23:3%d:36" % n, n) for n in range(CRASH_RESTARTS)]
    crash_bytes = sum(len(ln.encode()) for block in crash_blocks for ln in block)
    budget = max(0, size_bytes - crash_bytes)
    written = 0
    lines = 0
    tracebacks = 0
    with open(path, "w", encoding="utf-8") as fh:
        buf: list[str] = []
        second = 0
        while written < budget:
            second += 1
            clock = f"{8 + (second // 3600) % 15:02d}:{(second // 60) % 60:02d}:{second % 60:02d}"
            if rng.random() < 0.0004:
                block = _benign_traceback(rng, clock, api)
                tracebacks += 1
            else:
                block = [_chatter(rng, clock, api) for _ in range(20)]
            for ln in block:
                n = len(ln.encode())
                if written + n > budget:
                    break
                buf.append(ln)
                written += n
                lines += 1
            if len(buf) > 20000:
                fh.write("".join(buf))
                buf.clear()
            if written + 400 > budget:
                break
        fh.write("".join(buf))
        root_line = None
        for block in crash_blocks:
            for ln in block:
                lines += 1
                if root_line is None and "(Worker_TP4" in ln and "Traceback (most recent" in ln:
                    root_line = lines
            fh.write("".join(block))
            tracebacks += 3
    return {"root_type": "TypeError", "root_message": ROOT_MSG, "root_rank": "Worker_TP4",
            "root_line": root_line, "root_frame_line": 998, "restarts": CRASH_RESTARTS,
            "tracebacks": tracebacks, "lines": lines}


def run_benchmark(path: str | Path, *, repeat: int = 3) -> dict[str, Any]:
    """Best-of-`repeat` seconds for `analyse_file(path)` and for `grep -c Traceback path`."""
    from rewheel import diagnose

    p = Path(path)
    best = float("inf")
    diag = None
    for _ in range(repeat):
        t = time.perf_counter()
        diag = diagnose.analyse_file(p, package="vllm")
        best = min(best, time.perf_counter() - t)
    grep_best = None
    grep = shutil.which("grep")
    if grep:
        grep_best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            subprocess.run([grep, "-c", "Traceback", str(p)], capture_output=True, check=False)
            grep_best = min(grep_best, time.perf_counter() - t)
    size = p.stat().st_size
    return {"bytes": size, "analyse_s": round(best, 3), "grep_s": round(grep_best, 3) if grep_best else None,
            "ratio_to_grep": round(best / grep_best, 2) if grep_best else None,
            "mb_per_s": round(size / best / 1e6, 1), "summary": diag.summary() if diag else None}


def main(argv: list[str]) -> None:
    size_mb = float(argv[0]) if argv else 200.0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.log"
        t = time.perf_counter()
        info = generate_log(path, int(size_mb * 1e6))
        print(f"generated {path.stat().st_size / 1e6:.0f} MB ({info['lines']} lines) in {time.perf_counter() - t:.1f}s")
        print(run_benchmark(path))


if __name__ == "__main__":
    main(sys.argv[1:])
