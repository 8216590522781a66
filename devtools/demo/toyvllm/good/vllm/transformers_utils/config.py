"""Model configs from a local folder or the Hugging Face cache (offline)."""

import json
import os
from pathlib import Path


class PretrainedConfig:
    def __init__(self, data):
        for key, value in data.items():
            if isinstance(value, dict) and key.endswith("_config") and key != "quantization_config":
                value = PretrainedConfig(value)
            setattr(self, key, value)

    def to_dict(self):
        return {k: (v.to_dict() if isinstance(v, PretrainedConfig) else v)
                for k, v in self.__dict__.items()}


def hf_hub_cache():
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def model_dir(model, revision=None):
    p = Path(model)
    if p.is_dir():
        return p
    repo = hf_hub_cache() / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / (revision or "main")
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text().strip()
        if (snap / "config.json").is_file():
            return snap
    raise OSError(f"Can't load the configuration of '{model}': it is not a local folder and "
                  f"not in the Hugging Face cache ({repo}), and this build works offline")


def _apply_dict_overrides(config, overrides):
    for key, value in overrides.items():
        current = getattr(config, key, None)
        if isinstance(current, PretrainedConfig) and isinstance(value, dict):
            _apply_dict_overrides(current, value)
        else:
            setattr(config, key, value)


def get_config(model, trust_remote_code=False, revision=None, hf_overrides=None):
    path = model_dir(model, revision) / "config.json"
    config = PretrainedConfig(json.loads(path.read_text()))
    if hf_overrides:
        _apply_dict_overrides(config, hf_overrides)
    return config


def get_hf_text_config(config):
    return getattr(config, "text_config", config)
