"""Model-init smoke test for vLLM: build the engine for the real model on the real GPUs, with
random weights and the model shrunk, so that a broken build fails in seconds instead of after
a 20-minute weight load in production.

    {python} -m rewheel.smoke.vllm_init --model moonshotai/Kimi-K2.5-NVFP4 --tensor-parallel-size 8

It builds `vllm.LLM(model, load_format="dummy", hf_overrides=..., enforce_eager=True,
max_model_len=..., tensor_parallel_size=N)`. `hf_overrides` shrinks the model the way vLLM's
own model-init tests do — fewer hidden layers, fewer routed experts — while keeping every
per-layer shape (hidden size, heads, head dims, quantization), so init still runs the model's
attention, MoE and quantization code on every tensor-parallel rank: one dense layer and one MoE
layer for DeepSeek-style models, one layer otherwise. The overrides are derived from the model's
`config.json` (a local folder, the Hugging Face cache, or transformers' AutoConfig); multimodal
configs are shrunk inside their `text_config`. `--hf-overrides JSON` replaces the derived ones.

Exit status 0 when the engine initialised (and, with `--generate`, produced a token); 1 with
the error on stderr when it did not; 2 for bad arguments. Timings are printed either way.

This module runs under the TARGET environment's interpreter with rewheel's source folder on
PYTHONPATH (rewheel is not installed there): it imports only the standard library at import
time, and `vllm` inside `main`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PROG = "python -m rewheel.smoke.vllm_init"
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layers")
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "num_experts_per_token")
# Sub-configs that hold the language model of a multimodal checkpoint.
TEXT_SUBCONFIGS = ("text_config", "language_config", "llm_config")
MIN_EXPERTS = 8


def _say(msg: str) -> None:
    print(f"vllm_init: {msg}", flush=True)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def shrink_overrides(config: dict[str, Any], tensor_parallel_size: int = 1) -> dict[str, Any]:
    """hf_overrides that make `config`'s model small and keep every per-layer shape.

    - layers: 1; for DeepSeek-style configs with `first_k_dense_replace` dense layers before the
      MoE ones, 2 layers with 1 dense, so that both the dense MLP and the MoE path are built;
    - routed experts: max(8, tensor_parallel_size), rounded up to a multiple of `n_group` (grouped
      top-k needs whole groups); top-k capped at what the remaining groups can give.
    """
    out: dict[str, Any] = {}
    for sub in TEXT_SUBCONFIGS:
        if isinstance(config.get(sub), dict):
            inner = shrink_overrides(config[sub], tensor_parallel_size)
            if inner:
                out[sub] = inner
    layer_key = next((k for k in LAYER_KEYS if _int(config.get(k))), None)
    expert_key = next((k for k in EXPERT_KEYS if _int(config.get(k))), None)
    topk_key = next((k for k in TOPK_KEYS if _int(config.get(k))), None)
    if layer_key:
        layers = config[layer_key]
        want = 1
        dense = _int(config.get("first_k_dense_replace"))
        if expert_key and dense and layers > dense:
            want = 2
            out["first_k_dense_replace"] = 1
        if layers > want:
            out[layer_key] = want
    if expert_key:
        n = config[expert_key]
        n_group = max(1, _int(config.get("n_group")) or 1)
        target = max(MIN_EXPERTS, tensor_parallel_size)
        target = -(-target // n_group) * n_group
        if target < n:
            out[expert_key] = target
            if topk_key:
                topk_group = max(1, min(n_group, _int(config.get("topk_group")) or n_group))
                max_k = (target // n_group) * topk_group
                if config[topk_key] > max_k:
                    out[topk_key] = max_k
    return out


def _hf_hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def find_config_file(model: str, revision: str | None = None) -> Path | None:
    """config.json of a local model folder, or of the model's snapshot in the Hugging Face
    cache (`models--org--name/refs/<revision>` -> `snapshots/<commit>/config.json`)."""
    local = Path(model).expanduser()
    if local.is_dir():
        f = local / "config.json"
        return f if f.is_file() else None
    repo = _hf_hub_cache() / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / (revision or "main")
    candidates: list[Path] = []
    if ref.is_file():
        candidates.append(repo / "snapshots" / ref.read_text().strip() / "config.json")
    elif revision and (repo / "snapshots" / revision).is_dir():
        candidates.append(repo / "snapshots" / revision / "config.json")
    if not candidates and (repo / "snapshots").is_dir():
        candidates += sorted((repo / "snapshots").glob("*/config.json"),
                             key=lambda p: p.stat().st_mtime, reverse=True)
    return next((c for c in candidates if c.is_file()), None)


def load_model_config(model: str, revision: str | None = None,
                      trust_remote_code: bool = False) -> tuple[dict[str, Any] | None, str]:
    """(config dict, where it came from); (None, why) when it cannot be read."""
    f = find_config_file(model, revision)
    if f is not None:
        try:
            return json.loads(f.read_text()), str(f)
        except (OSError, json.JSONDecodeError) as exc:
            return None, f"{f}: {exc}"
    try:
        from transformers import AutoConfig  # the target env has it wherever vLLM runs
    except ImportError:
        return None, "no config.json found and transformers is not importable"
    try:
        cfg = AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as exc:  # a config we cannot read is reported, not fatal: vLLM will say more
        return None, f"transformers.AutoConfig: {type(exc).__name__}: {exc}"
    return cfg.to_dict(), "transformers.AutoConfig"


def make_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model id or local folder, as `vllm serve` takes it")
    ap.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--revision", default=None)
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--quantization", default=None, help="as `vllm serve --quantization`")
    ap.add_argument("--kv-cache-dtype", default=None)
    ap.add_argument("--hf-overrides", default=None, metavar="JSON",
                    help="overrides for the model's config, replacing the derived ones")
    ap.add_argument("--no-shrink", action="store_true",
                    help="init the full-size model (still with dummy weights)")
    ap.add_argument("--llm-kwargs", default=None, metavar="JSON",
                    help="further keyword arguments for vllm.LLM, e.g. '{\"enable_expert_parallel\": true}'")
    ap.add_argument("--generate", action="store_true", help="also generate one token")
    return ap


def _json_arg(ap: argparse.ArgumentParser, flag: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        ap.error(f"{flag}: not valid JSON ({exc}): {text!r}")
    if not isinstance(value, dict):
        ap.error(f"{flag}: expected a JSON object, got {text!r}")
    return value


def llm_kwargs(args: argparse.Namespace, hf_overrides: dict[str, Any] | None,
               extra: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": args.model, "tensor_parallel_size": args.tensor_parallel_size,
        "load_format": "dummy", "enforce_eager": True, "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization, "max_num_seqs": args.max_num_seqs,
        "trust_remote_code": args.trust_remote_code,
    }
    for key in ("revision", "quantization", "kv_cache_dtype"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    if hf_overrides:
        kwargs["hf_overrides"] = hf_overrides
    kwargs.update(extra)
    return kwargs


def main(argv: list[str] | None = None) -> int:
    ap = make_parser()
    args = ap.parse_args(argv)
    if args.tensor_parallel_size < 1:
        ap.error(f"--tensor-parallel-size: expected 1 or more, got {args.tensor_parallel_size}")
    extra = _json_arg(ap, "--llm-kwargs", args.llm_kwargs) if args.llm_kwargs else {}
    t_start = time.monotonic()
    timings: dict[str, float] = {}

    if args.hf_overrides is not None:
        overrides: dict[str, Any] | None = _json_arg(ap, "--hf-overrides", args.hf_overrides)
        source = "--hf-overrides"
    elif args.no_shrink:
        overrides, source = None, "--no-shrink"
    else:
        config, where = load_model_config(args.model, args.revision, args.trust_remote_code)
        if config is None:
            overrides, source = None, f"config not readable ({where}); model not shrunk"
        else:
            overrides, source = shrink_overrides(config, args.tensor_parallel_size), f"derived from {where}"
    _say(f"model={args.model} tensor_parallel_size={args.tensor_parallel_size} "
         f"max_model_len={args.max_model_len} load_format=dummy enforce_eager=True")
    _say(f"hf_overrides={json.dumps(overrides, sort_keys=True) if overrides else '{}'} ({source})")

    phase = "import vllm"
    try:
        t = time.monotonic()
        import vllm

        timings["import_s"] = time.monotonic() - t
        _say(f"vllm {getattr(vllm, '__version__', '?')} from {os.path.dirname(vllm.__file__)} "
             f"(imported in {timings['import_s']:.1f}s)")
        phase = "engine init"
        kwargs = llm_kwargs(args, overrides, extra)
        t = time.monotonic()
        llm = vllm.LLM(**kwargs)
        timings["init_s"] = time.monotonic() - t
        _say(f"engine initialised in {timings['init_s']:.1f}s")
        if args.generate:
            phase = "generate"
            t = time.monotonic()
            outputs = llm.generate(["The capital of France is"],
                                   vllm.SamplingParams(max_tokens=1, temperature=0.0))
            timings["generate_s"] = time.monotonic() - t
            text = outputs[0].outputs[0].text if outputs and outputs[0].outputs else ""
            _say(f"generated 1 token in {timings['generate_s']:.2f}s: {text!r}")
        phase = "shutdown"
        shutdown = getattr(llm, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm
        gc.collect()
    except BaseException as exc:  # noqa: BLE001 — every way out is a smoke result, with its story
        if isinstance(exc, KeyboardInterrupt):
            raise
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise
        timings["total_s"] = time.monotonic() - t_start
        sys.stdout.flush()
        traceback.print_exc()
        sys.stderr.flush()
        print(f"vllm_init: FAILED during {phase} after {timings['total_s']:.1f}s: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        _say("timings " + json.dumps({k: round(v, 3) for k, v in timings.items()}))
        return 1
    timings["total_s"] = time.monotonic() - t_start
    _say("OK: " + ", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f}s" for k, v in timings.items()))
    _say("timings " + json.dumps({k: round(v, 3) for k, v in timings.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
