"""The synthetic vLLM environment: which distributions, how many files, how many bytes.

At scale 1.0 the profile matches a real vLLM virtualenv: 200 distributions, about 57,000
files and 8 GB, with torch (15,000 files, 1.1 GB), the nvidia libraries (3.1 GB in a few
multi-hundred-MB shared libraries), vllm (2,800 files, 0.8 GB), triton, flashinfer and a
long tail of small pure-Python distributions. `scale` multiplies every file count and every
byte count (the number of distributions stays 200: uv's and rewheel's per-distribution work
is part of what is measured).

Wheels are generated deterministically (same scale, same bytes) with
`devtools.wheelbuild.build_wheel`: small files are Python-like text, large ones are
incompressible bytes stored uncompressed. The upgraded distributions' new versions change
about 5% of their small files, drop 1%, add 1%, and replace every large binary — as a
nightly rebuild does.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from devtools.wheelbuild import build_wheel, wheel_filename

MB = 1 << 20
PROFILE_VERSION = 3  # bump when the generated content changes: invalidates .bench caches

# The story's hand-made patches live in these vllm files.
PATCHED_FILES = (
    "vllm/model_executor/models/deepseek_v2.py",
    "vllm/model_executor/model_loader/gguf_loader.py",
    "vllm/model_executor/model_loader/weight_utils.py",
)


@dataclass(frozen=True)
class DistProfile:
    name: str
    top: str  # the folder its files live under, e.g. "torch" or "nvidia/cublas"
    version: str
    files: int  # at scale 1.0, large ones included
    small_mb: float  # total size of the small files at scale 1.0
    big_mb: tuple[float, ...] = ()  # the large shared libraries at scale 1.0
    new_version: str | None = None  # upgraded in the benchmark's scenario


_NAMED: tuple[DistProfile, ...] = (
    DistProfile("torch", "torch", "2.9.0", 15000, 250, (560, 290), "2.9.1"),
    DistProfile("vllm", "vllm", "0.11.0", 2800, 60, (380, 170, 120, 70), "0.11.1.dev44+g5719a4e4e"),
    DistProfile("triton", "triton", "3.5.0", 1500, 80, (220, 120), "3.5.1"),
    DistProfile("flashinfer-python", "flashinfer", "0.6.3", 1800, 90, (150,), "0.6.4"),
    DistProfile("nvidia-cublas-cu12", "nvidia/cublas", "12.8.4.1", 40, 2, (520, 90)),
    DistProfile("nvidia-cudnn-cu12", "nvidia/cudnn", "9.10.2.21", 60, 2, (400, 250, 120, 80, 50)),
    DistProfile("nvidia-nccl-cu12", "nvidia/nccl", "2.27.5", 10, 1, (240,)),
    DistProfile("nvidia-cusparse-cu12", "nvidia/cusparse", "12.5.8.93", 20, 1, (280,)),
    DistProfile("nvidia-cufft-cu12", "nvidia/cufft", "11.3.3.83", 20, 1, (270,)),
    DistProfile("nvidia-cusolver-cu12", "nvidia/cusolver", "11.7.3.90", 20, 1, (260,)),
    DistProfile("nvidia-cusparselt-cu12", "nvidia/cusparselt", "0.7.1", 10, 1, (220,)),
    DistProfile("nvidia-curand-cu12", "nvidia/curand", "10.3.9.90", 15, 1, (95,)),
    DistProfile("nvidia-cuda-nvrtc-cu12", "nvidia/cuda_nvrtc", "12.8.93", 15, 1, (85,)),
    DistProfile("nvidia-nvjitlink-cu12", "nvidia/nvjitlink", "12.8.93", 10, 1, (55,)),
    DistProfile("nvidia-cufile-cu12", "nvidia/cufile", "1.13.1.3", 20, 1, (30,)),
    DistProfile("nvidia-cuda-cupti-cu12", "nvidia/cuda_cupti", "12.8.90", 60, 2, (20,)),
    DistProfile("nvidia-cuda-runtime-cu12", "nvidia/cuda_runtime", "12.8.90", 30, 1, (5,)),
    DistProfile("xformers", "xformers", "0.0.32", 600, 20, (180,)),
    DistProfile("transformers", "transformers", "4.57.1", 3800, 90),
    DistProfile("ray", "ray", "2.50.1", 3000, 120, (90,)),
    DistProfile("scipy", "scipy", "1.16.2", 1600, 60, (30, 20)),
    DistProfile("sympy", "sympy", "1.14.0", 1500, 60),
    DistProfile("numpy", "numpy", "2.2.6", 900, 20, (25,)),
    DistProfile("opencv-python-headless", "cv2", "4.12.0.88", 100, 5, (90,)),
)

FULL_DISTS = 200
FULL_FILES = 57000
FULL_MB = 8 * 1024


def full_profile() -> list[DistProfile]:
    """The named distributions plus a deterministic long tail up to 200 / 57k / 8 GB."""
    dists = list(_NAMED)
    n_tail = FULL_DISTS - len(dists)
    files_left = FULL_FILES - sum(d.files for d in dists)
    mb_left = FULL_MB - sum(d.small_mb + sum(d.big_mb) for d in dists)
    rng = random.Random(7)
    weights = [rng.paretovariate(1.2) for _ in range(n_tail)]
    total_w = sum(weights)
    # A sixth of the tail carries a compiled extension (grpcio, pyarrow-like); the rest is
    # small pure Python.
    with_ext = set(range(0, n_tail, 6))
    ext_mb = (mb_left - files_left * 0.02) / len(with_ext)  # 20 KB average small file
    for i, w in enumerate(weights):
        files = max(3, round(files_left * w / total_w))
        big = (round(ext_mb * (0.5 + (i % 5) / 4), 1),) if i in with_ext else ()
        dists.append(DistProfile(f"benchdep-{i:03d}", f"benchdep_{i:03d}", f"1.{i % 7}.{i % 3}",
                                 files, files * 0.02, big))
    return dists


@dataclass(frozen=True)
class Scaled:
    profile: DistProfile
    n_small: int
    small_bytes: int
    big_bytes: tuple[int, ...]


def scaled(p: DistProfile, scale: float) -> Scaled:
    n_files = max(len(p.big_mb) + 2, round(p.files * scale))
    return Scaled(p, n_files - len(p.big_mb), max(2048, int(p.small_mb * MB * scale)),
                  tuple(max(64 * 1024, int(b * MB * scale)) for b in p.big_mb))


def totals(scale: float) -> dict[str, int]:
    ss = [scaled(p, scale) for p in full_profile()]
    return {"distributions": len(ss), "files": sum(s.n_small + len(s.big_bytes) for s in ss),
            "bytes": sum(s.small_bytes + sum(s.big_bytes) for s in ss)}


# --------------------------------------------------------------------------------------
# Content
# --------------------------------------------------------------------------------------
_WORDS = ("self", "def", "return", "import", "tensor", "torch", "layer", "weight", "config",
          "forward", "attention", "rank", "kv_cache", "dtype", "device", "None", "if", "else",
          "for", "in", "range", "shape", "hidden_size", "num_heads", "quant", "block", "scale")
_POOL_SIZE = 8 * MB


def _text_pool() -> bytes:
    rng = random.Random(11)
    lines = []
    size = 0
    while size < _POOL_SIZE:
        indent = "    " * rng.randrange(0, 4)
        line = indent + " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(2, 12))) + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()[:_POOL_SIZE]


_POOL: bytes | None = None
_BLOCK_CACHE: dict[int, bytes] = {}


def _pool() -> bytes:
    global _POOL
    if _POOL is None:
        _POOL = _text_pool()
    return _POOL


def _blob(seed: str, size: int) -> bytes:
    """Incompressible-looking bytes: a 4 MiB random block tiled, behind a unique header."""
    if 0 not in _BLOCK_CACHE:
        _BLOCK_CACHE[0] = random.Random(13).randbytes(4 * MB)
    block = _BLOCK_CACHE[0]
    head = hashlib.sha256(seed.encode()).digest() * 2
    body = size - len(head)
    if body <= 0:
        return head[:size]
    # Rotate the block per file so that no two files share long runs at the same offset.
    rot = int.from_bytes(head[:4], "little") % len(block)
    block = block[rot:] + block[:rot]
    reps, rem = divmod(body, len(block))
    return head + block * reps + block[:rem]


def _small_paths(top: str, n: int, rng: random.Random) -> list[str]:
    exts = (".py",) * 6 + (".pyi", ".h", ".json", ".cuh")
    paths = []
    for k in range(n):
        d = k // 14  # ~14 files a folder
        parts = []
        while True:
            parts.append(f"m{d % 9}")
            d //= 9
            if d == 0:
                break
        paths.append(f"{top}/{'/'.join(reversed(parts))}/f{k:05d}{rng.choice(exts)}")
    return paths


def dist_files(s: Scaled, version: str) -> dict[str, bytes]:
    """The files of one distribution's wheel at `version` (the new version varies some)."""
    p = s.profile
    rng = random.Random(f"{p.name}/layout")
    pool = _pool()
    paths = _small_paths(p.top, s.n_small, rng)
    if p.name == "vllm":
        paths[: len(PATCHED_FILES)] = list(PATCHED_FILES)
    # Sizes: lognormal around the mean, so a few files are large and most are small.
    raw = [rng.lognormvariate(0, 1.0) for _ in paths]
    norm = s.small_bytes / sum(raw)
    sizes = [max(32, min(4 * MB, int(r * norm))) for r in raw]
    offsets = [rng.randrange(0, len(pool) - sz) for sz in sizes]
    upgraded = version != p.version
    vrng = random.Random(f"{p.name}/{version}")
    files: dict[str, bytes] = {f"{p.top}/__init__.py": f'__version__ = "{version}"\n'.encode()}
    for path, sz, off in zip(paths, sizes, offsets, strict=True):
        if path in files:
            continue
        head = f"# {path}\n".encode()
        body = pool[off: off + sz]
        if upgraded:
            roll = vrng.random()
            if roll < 0.01 and path not in PATCHED_FILES:
                continue  # removed in the new version
            if roll < 0.06:
                body += f"    # changed in {version}\n".encode()
            if roll > 0.99:
                files[path.replace("/f", "/new_f", 1)] = head + pool[off: off + sz // 2]
        files[path] = head + body
    for i, size in enumerate(s.big_bytes):
        tag = version if upgraded else p.version
        files[f"{p.top}/lib/lib{p.top.replace('/', '_')}_{i}.so"] = _blob(f"{p.name}/{tag}/{i}", size)
    return files


def build_dist(args: tuple[Scaled, str, str]) -> str:
    """Build one wheel into out_dir (a process-pool task); returns the wheel's path."""
    s, version, out_dir = args
    target = Path(out_dir) / wheel_filename(s.profile.name, version)
    if target.exists():
        return str(target)
    tmp_dir = Path(out_dir) / f".tmp-{s.profile.name}-{version}"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    built = build_wheel(tmp_dir, s.profile.name, version, dist_files(s, version),
                        store_over=1 * MB, summary=f"synthetic {s.profile.name} for rewheel's benchmarks")
    built.rename(target)  # only complete wheels ever carry the final name
    tmp_dir.rmdir()
    return str(target)
