"""The GPU check's model and the processes that put it on a GPU (`devtools/gpu_check.py`).

    python gpu_smoke.py make-model DIR     a tiny random-weight Llama-style decoder, made locally
                                           with transformers and saved as safetensors
    python gpu_smoke.py smoke --model DIR  load it onto the GPU and run one forward pass: the
                                           smoke command of the check's recipes
    python gpu_smoke.py hold --mib N       hold N MiB on the GPU until killed: "a GPU held by
                                           another process"

It runs under the checked environment's interpreter (a virtualenv made with
--system-site-packages over the host's torch), so it imports only the standard library at
import time. How `smoke` behaves is decided by the environment's build, as a broken nightly
would decide it: the `gpucheck_knob` package's `MODE` — "ok"; "oom", an allocation larger than
the card; "assert", a token id past the vocabulary, a device-side assert in the embedding
kernel; "hang", the model on the GPU and then no progress, until rewheel's timeout kills it.

Every fact goes to stdout as one line `gpu_smoke: WORD {json}` (START, DEVICE, LOADED, READY,
HANGING, HOLDING, MODEL). A failure is an uncaught exception, so the log holds the real
traceback that `rewheel why` reads.

`--backend standin` (for the tests; it proves nothing about a GPU) does the same bookkeeping
on a CPU without torch: it makes a real safetensors file with the standard library, "holds"
memory by registering with the `nvidia-smi` stand-in (`$REWHEEL_FAKE_ROOT/gpu-procs.json`,
shown while the process lives), and fails the way torch fails, with torch's messages.
"""

from __future__ import annotations

import argparse
import array
import fcntl
import json
import math
import os
import random
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PREFIX = "gpu_smoke:"
T0 = time.monotonic()

# The model's shape: Llama's layout (grouped-query attention, SwiGLU MLP, RMSNorm, untied head),
# a few layers; the stand-in's is smaller still (its weights are written by pure Python).
SHAPES = {
    "torch": dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2),
    "standin": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2),
}
BATCH, SEQ = 2, 64
MODES = ("ok", "oom", "assert", "hang")


def say(word: str, **facts: Any) -> None:
    print(f"{PREFIX} {word} {json.dumps(facts, sort_keys=True)}", flush=True)


def since_process_start() -> float:
    """Seconds since this process was started (from /proc: interpreter start-up included)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - T0


def build_mode() -> tuple[str, str | None]:
    """(MODE, version) of the environment's `gpucheck_knob`; ("ok", None) without one."""
    try:
        import gpucheck_knob  # type: ignore[import-not-found]
    except ImportError:
        return "ok", None
    mode = getattr(gpucheck_knob, "MODE", "ok")
    if mode not in MODES:
        raise SystemExit(f"gpucheck_knob.MODE = {mode!r}: expected one of {', '.join(MODES)}")
    return mode, getattr(gpucheck_knob, "__version__", None)


def llama_tensors(cfg: dict[str, int]) -> dict[str, list[int]]:
    """The tensor names and shapes of a LlamaForCausalLM checkpoint with this config."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * (h // cfg["num_attention_heads"])
    out = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out |= {p + "self_attn.q_proj.weight": [h, h], p + "self_attn.k_proj.weight": [kv, h],
                p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, h],
                p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                p + "mlp.down_proj.weight": [h, i], p + "input_layernorm.weight": [h],
                p + "post_attention_layernorm.weight": [h]}
    return out


def read_safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def check_checkpoint(model: Path) -> tuple[dict[str, Any], int]:
    """The model folder holds a config and a safetensors file with every tensor a Llama of that
    config has, at its shape (more may be there): (config, parameter count). Raises ValueError
    naming what is off."""
    cfg = json.loads((model / "config.json").read_text())
    header = read_safetensors_header(model / "model.safetensors")
    want = llama_tensors(cfg)
    got = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
    missing = sorted(set(want) - set(got))
    wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    if missing or wrong:
        raise ValueError(f"{model}: not the expected checkpoint (missing {missing[:3]}, "
                         f"wrong shapes {wrong[:3]})")
    return cfg, sum(math.prod(s) for s in got.values())


# --- the torch backend: the real thing ------------------------------------------------------

class TorchBackend:
    def make_model(self, out: Path, seed: int) -> dict[str, Any]:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        cfg = LlamaConfig(**SHAPES["torch"], max_position_embeddings=2048, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        # Safetensors: the default since transformers 4.35, the only format in 5 (which refuses
        # the old `safe_serialization` argument).
        model.save_pretrained(str(out))
        return {"params": sum(p.numel() for p in model.parameters()), "transformers": _version("transformers")}

    def device(self) -> dict[str, Any]:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} sees no CUDA device "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        props = torch.cuda.get_device_properties(0)
        uuid = getattr(props, "uuid", None)  # torch's _CUuuid: the UUID without nvidia-smi's "GPU-"
        free, total = torch.cuda.mem_get_info(0)
        return {"torch": torch.__version__, "cuda": torch.version.cuda,
                "device_count": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
                "uuid": f"GPU-{str(uuid).removeprefix('GPU-')}" if uuid is not None else None,
                "total_mib": total >> 20, "free_mib": free >> 20}

    def smoke(self, model_dir: Path, mode: str, on_hang: Callable[[], None]) -> dict[str, Any]:
        import torch
        from transformers import AutoModelForCausalLM

        dev = torch.device("cuda", 0)
        t = time.monotonic()
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
        model = model.to(device=dev, dtype=torch.bfloat16).eval()
        torch.cuda.synchronize(dev)
        say("LOADED", load_s=round(time.monotonic() - t, 3), params=sum(p.numel() for p in model.parameters()),
            allocated_mib=torch.cuda.memory_allocated(dev) >> 20)
        if mode == "hang":
            on_hang()
        if mode == "oom":
            # The new build sizes its workspace from the card's memory, and gets it wrong.
            _free, total = torch.cuda.mem_get_info(dev)
            torch.empty(int(total * 1.5), dtype=torch.uint8, device=dev)
        vocab = model.config.vocab_size
        gen = torch.Generator(device=dev).manual_seed(0)
        ids = torch.randint(0, vocab, (BATCH, SEQ), device=dev, generator=gen)
        if mode == "assert":
            ids[0, -1] = vocab + 7  # a token id past the vocabulary: the embedding kernel asserts
        t = time.monotonic()
        with torch.inference_mode():
            logits = model(input_ids=ids).logits
            torch.cuda.synchronize(dev)
        finite = bool(torch.isfinite(logits).all().item())
        if not finite:
            raise RuntimeError("the forward pass produced non-finite logits")
        return {"forward_s": round(time.monotonic() - t, 3), "logits": list(logits.shape),
                "peak_mib": torch.cuda.max_memory_allocated(dev) >> 20}

    def hold(self, mib: int) -> dict[str, Any]:
        import torch

        x = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        self._held = x  # kept alive until the process ends
        return {"torch": torch.__version__}


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


# --- the stand-in backend: the tests' CPU ----------------------------------------------------

class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError, as the stand-in raises it."""


class AcceleratorError(RuntimeError):
    """torch.AcceleratorError, as the stand-in raises it."""


# Printed as torch prints them ("torch.OutOfMemoryError: CUDA out of memory. ...").
OutOfMemoryError.__module__ = AcceleratorError.__module__ = "torch"


class StandinBackend:
    def __init__(self) -> None:
        root = os.environ.get("REWHEEL_FAKE_ROOT")
        if not root:
            raise SystemExit("--backend standin needs REWHEEL_FAKE_ROOT (the nvidia-smi stand-in's folder)")
        self.root = Path(root)

    def _gpu(self) -> dict[str, Any]:
        gpus = sorted(json.loads((self.root / "gpus.json").read_text()), key=lambda g: int(g["index"]))
        first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            first = str(gpus[0]["index"]) if gpus else ""
        found = [g for g in gpus if str(g["index"]) == first or (first.startswith("GPU-") and g["uuid"].startswith(first))]
        if not found:
            raise RuntimeError(f"no CUDA device (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        return found[0]

    def _hold(self, mib: int) -> None:
        """Show this process holding `mib` on its GPU (the stand-in lists it while it lives)."""
        with open(self.root / "gpu-procs.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.root / "gpu-procs.json"
            procs = json.loads(path.read_text()) if path.exists() else []
            procs.append({"pid": os.getpid(), "process_name": sys.executable, "used_memory": mib,
                          "gpu_uuid": self._gpu()["uuid"]})
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(procs))
            tmp.replace(path)

    def make_model(self, out: Path, seed: int) -> dict[str, Any]:
        shapes = SHAPES["standin"]
        cfg = {**shapes, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
               "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "float32"}
        rng = random.Random(seed)
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        blobs: list[bytes] = []
        offset = 0
        tensors = llama_tensors(shapes)
        for name, shape in tensors.items():
            data = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(math.prod(shape)))).tobytes()
            header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
            blobs.append(data)
            offset += len(data)
        head = json.dumps(header).encode()
        head += b" " * (-len(head) % 8)
        with open(out / "model.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(head)) + head)
            for b in blobs:
                f.write(b)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        return {"params": sum(math.prod(shape) for shape in tensors.values()), "transformers": None}

    def device(self) -> dict[str, Any]:
        g = self._gpu()
        return {"torch": "stand-in", "cuda": None, "device_count": 1, "name": g["name"], "uuid": g["uuid"],
                "total_mib": int(g["memory_total"]), "free_mib": int(g["memory_total"])}

    def smoke(self, model_dir: Path, mode: str, on_hang: Callable[[], None]) -> dict[str, Any]:
        t = time.monotonic()
        cfg, params = check_checkpoint(model_dir)
        self._hold(512 + (params * 2 >> 20))
        say("LOADED", load_s=round(time.monotonic() - t, 3), params=params, allocated_mib=params * 2 >> 20)
        if mode == "hang":
            on_hang()
        total = int(self._gpu()["memory_total"])
        if mode == "oom":
            want = total * 1.5 / 1024
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {want:.2f} GiB. GPU 0 has a total capacity of "
                f"{total / 1024:.2f} GiB of which {total / 1024 - 0.6:.2f} GiB is free. Including non-PyTorch "
                "memory, this process has 600.00 MiB memory in use. Of the allocated memory 80.00 MiB is "
                "allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated. If reserved but "
                "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
                "avoid fragmentation.  See documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
        if mode == "assert":
            print("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1422: indexSelectSmallIndex: block: [0,0,0], "
                  "thread: [63,0,0] Assertion `srcIndex < srcSelectDimSize` failed.", flush=True)
            raise AcceleratorError(
                "CUDA error: device-side assert triggered\nSearch for `cudaErrorAssert' in "
                "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
        return {"forward_s": round(time.monotonic() - t, 3), "logits": [BATCH, SEQ, cfg["vocab_size"]],
                "peak_mib": params * 2 >> 20}

    def hold(self, mib: int) -> dict[str, Any]:
        self._hold(mib)
        return {"torch": "stand-in"}


# --- the commands ---------------------------------------------------------------------------

def _hang() -> None:
    say("HANGING", since_start_s=round(since_process_start(), 3))
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_smoke.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("torch", "standin"), default="torch")
    sub = ap.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make-model", help="make the tiny random-weight model in DIR")
    mk.add_argument("dir", type=Path)
    mk.add_argument("--seed", type=int, default=0)
    sm = sub.add_parser("smoke", help="load the model onto the GPU and run one forward pass")
    sm.add_argument("--model", type=Path, required=True)
    sm.add_argument("--mode", choices=MODES, default=None, help="instead of the build's gpucheck_knob")
    hd = sub.add_parser("hold", help="hold memory on the GPU until killed")
    hd.add_argument("--mib", type=int, required=True)
    args = ap.parse_args(argv)
    backend = TorchBackend() if args.backend == "torch" else StandinBackend()

    if args.command == "make-model":
        args.dir.mkdir(parents=True, exist_ok=True)
        facts = backend.make_model(args.dir, args.seed)
        _cfg, params = check_checkpoint(args.dir)
        files = {p.name: p.stat().st_size for p in sorted(args.dir.iterdir()) if p.is_file()}
        say("MODEL", dir=str(args.dir), files=files, **{**facts, "params": params})
        return 0
    if args.command == "hold":
        facts = backend.hold(args.mib)
        say("HOLDING", pid=os.getpid(), mib=args.mib, **facts)
        while True:
            time.sleep(3600)
    mode, version = build_mode()
    mode = args.mode or mode
    say("START", pid=os.getpid(), python=sys.executable, knob=version, mode=mode,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    say("DEVICE", **backend.device())
    facts = backend.smoke(args.model, mode, _hang)
    say("READY", since_start_s=round(since_process_start(), 3), **facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
