"""A toy `vllm` for the demo and the tests: stdlib only, no GPU, shaped like the real thing.

Its source is real files next to this module: `good/` is the whole good build (the story's
dev313), `bad/` holds the files the bad build (dev344) replaces or adds, `BAD_REMOVED` the ones
it drops and `_BAD_EDITS` its small edits to the rest; `flashinfer/` is the toy flashinfer.
`@VERSION@` in a file is replaced by the build's version.

`toy_vllm_files(version, bad=...)` returns the files of a wheel that mimics vLLM where it
matters to rewheel: the `vllm` console script and `vllm serve` (an HTTP server with
`/health` and `/v1/models` that answers only once the engine has initialised), `vllm.LLM`
(accepting the real arguments: `load_format`, `hf_overrides`, `enforce_eager`,
`max_model_len`, `tensor_parallel_size`, ...), an engine core process `EngineCore_DP0` that
spawns one worker process per tensor-parallel rank (`Worker_TP0..N-1`), each printing with
vLLM's `(Worker_TP4 pid=…) ` prefix and `INFO 02-20 23:31:36 [file.py:NN]` log headers, and
a DeepSeek-V2 model whose decoder layer builds `self.self_attn = attn_cls(...)`.

The bad build (`bad=True`, the story's dev344) carries a new head-sharding helper for MLA
attention with an off-by-one that leaves tensor-parallel rank 4 (of 8) without query heads,
so attention init fails there and only there, followed by the cascade real vLLM prints
("WorkerProc was terminated", "Engine core initialization failed. See root cause above").
It also differs from the good build in several other files, adds one file and removes one,
so that a source diff between the two has something to show.

The model config comes from a Hugging Face–style cache (`$HF_HOME/hub/models--org--name/…`):
`toy_model_config()` is the config the demo writes there (Kimi-K2.5's shape: a multimodal
wrapper with a DeepSeek-V3 `text_config`, MLA attention, 384 routed experts, NVFP4).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from packaging.version import Version

# The story's two nightlies (setuptools-scm versions, `g` + 9-hex short sha).
GOOD_SHA = "8c1b3f2a0"
BAD_SHA = "5719a4e4e"
GOOD_VERSION = f"0.16.0rc2.dev313+g{GOOD_SHA}"
BAD_VERSION = f"0.16.0rc2.dev344+g{BAD_SHA}"
FLASHINFER_GOOD = "0.6.3"
FLASHINFER_BAD = "0.6.4"
TOY_MODEL = "toy/Kimi-K2.5-mini"
PROJECT_URLS = {"Homepage": "https://github.com/vllm-project/vllm",
                "Source": "https://github.com/vllm-project/vllm"}

HERE = Path(__file__).resolve().parent
# Only in the good build: dev344 removed FlashMLA (legacy) once FlashInfer covered every GPU.
BAD_REMOVED = ("vllm/attention/backends/mla/__init__.py", "vllm/attention/backends/mla/flashmla_legacy.py")


def _tree(root: Path) -> dict[str, str]:
    """Every file under root by its path relative to root, in sorted order (the order the
    wheel's members and RECORD rows get). Read as bytes: the text goes into the wheel as is."""
    return {p.relative_to(root).as_posix(): p.read_bytes().decode("utf-8")
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


# Small differences between the builds, so the diff has more than the culprit to show.
_BAD_EDITS: list[tuple[str, str, str]] = [
    ("vllm/envs.py", 'VLLM_ENGINE_READY_TIMEOUT_S = int(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))\n',
     'VLLM_ENGINE_READY_TIMEOUT_S = int(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))\n'
     '# Mirror MLA query heads across the two halves of the TP group (see head_layout.py).\n'
     'VLLM_MLA_MIRROR_HEADS = os.environ.get("VLLM_MLA_MIRROR_HEADS", "1") == "1"\n'),
    ("vllm/v1/worker/gpu_model_runner.py", '        logger.info("Starting to load model %s...", mc.model)\n',
     '        logger.info("Starting to load model %s (rank %s)...", mc.model, self.device)\n'),
    ("vllm/model_executor/layers/fused_moe/layer.py",
     '        self.intermediate_size_per_partition = intermediate_size // tp_size\n',
     '        if intermediate_size % tp_size:\n'
     '            raise ValueError(f"moe_intermediate_size ({intermediate_size}) is not divisible by tp_size ({tp_size})")\n'
     '        self.intermediate_size_per_partition = intermediate_size // tp_size\n'),
    ("vllm/attention/layer.py", '        self.backend = "FLASHINFER_MLA"\n',
     '        # FlashMLA (legacy) is gone; FlashInfer covers every supported GPU now.\n'
     '        self.backend = "FLASHINFER_MLA"\n'),
]


def toy_vllm_files(version: str, *, bad: bool) -> dict[str, str]:
    """The files of the toy vllm wheel `version`; `bad` is the build whose attention init
    fails on tensor-parallel rank 4."""
    files = _tree(HERE / "good")
    if bad:
        for path in BAD_REMOVED:
            del files[path]
        files.update(_tree(HERE / "bad"))
        for path, old, new in _BAD_EDITS:
            if old not in files[path]:
                raise AssertionError(f"toy vllm: edit anchor missing in {path}: {old!r}")
            files[path] = files[path].replace(old, new, 1)
    ver = str(Version(version))
    return {path: text.replace("@VERSION@", ver) for path, text in sorted(files.items())}


def toy_vllm_requires(bad: bool) -> list[str]:
    return [f"flashinfer-python=={FLASHINFER_BAD if bad else FLASHINFER_GOOD}"]


def toy_flashinfer_files(version: str) -> dict[str, str]:
    return {path: text.replace("@VERSION@", version) for path, text in _tree(HERE / "flashinfer").items()}


def toy_model_config(num_hidden_layers: int = 61) -> dict:
    """A Kimi-K2.5-shaped config.json (multimodal wrapper; DeepSeek-V3 text model; NVFP4)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
            "num_hidden_layers": num_hidden_layers, "num_attention_heads": 64,
            "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
            "vocab_size": 163840, "max_position_embeddings": 262144,
        },
        "vision_config": {"model_type": "moonvit", "num_hidden_layers": 27, "hidden_size": 1152},
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                "exclude_modules": ["vision_tower", "mm_projector", "lm_head"]},
    }


def write_hf_cache(hf_home: str | os.PathLike[str], model: str = TOY_MODEL,
                   config: dict | None = None) -> str:
    """Put `config.json` for `model` into `<hf_home>/hub` the way huggingface_hub lays out its
    cache (refs/main -> snapshots/<commit>/). Returns the snapshot folder."""
    repo = Path(hf_home) / "hub" / ("models--" + model.replace("/", "--"))
    commit = "3f1c2a9e8b7d4c219e0a1d2b3c4d5e6f7a8b9c0d"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(config or toy_model_config(), indent=2) + "\n")
    (snap / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 262144}) + "\n")
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return str(snap)


def short_sha(version: str) -> str | None:
    """The git sha of a setuptools-scm local version label (`+g5719a4e4e` -> `5719a4e4e`)."""
    m = re.search(r"\+g([0-9a-f]{7,40})", version)
    return m.group(1) if m else None
