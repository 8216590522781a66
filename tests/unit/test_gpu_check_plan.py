"""The GPU check's own logic (devtools/gpu_check.py, devtools/gpu_stage.py, devtools/gpu_smoke.py):
its verdict and table, the GPU it picks, the recipes it writes (valid rewheel recipes), the
facts it reads from the smoke's output, the wheels it installs from, the environment its
commands get, and the byte-for-byte comparison of a tree. The whole check runs end to end on
the nvidia-smi stand-in in tests/test_gpu_check.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools import gpu_check, gpu_smoke, gpu_stage
from devtools.wheelbuild import build_wheel
from rewheel import gpu
from rewheel.recipe import load_recipe


def outcome(*oks: bool | None) -> gpu_check.Outcome:
    out = gpu_check.Outcome(mode="gpu")
    for i, ok in enumerate(oks):
        out.add(str(i % 5), f"check {i}", ok, f"detail {i}\nsecond line", 0.5)
    return out


def test_the_verdict_is_held_only_when_every_check_held() -> None:
    assert outcome(True, None, True).exit_code == gpu_check.EXIT_HELD
    assert outcome(True, False, True).exit_code == gpu_check.EXIT_FAILED
    assert gpu_check.Outcome(mode="gpu").exit_code == gpu_check.EXIT_FAILED  # nothing checked, nothing held
    stopped = outcome(True)
    stopped.stopped = "no wheels"
    assert stopped.exit_code == gpu_check.EXIT_USAGE
    assert (gpu_check.EXIT_HELD, gpu_check.EXIT_FAILED, gpu_check.EXIT_USAGE, gpu_check.EXIT_NO_GPU) == (0, 1, 2, 3)


def test_the_table_has_a_row_per_check_grouped_by_part_and_says_what_did_not_hold() -> None:
    out = gpu_check.Outcome(mode="standin")
    out.add("3", "revert", False, "4 files differ: ['a']\nmore")
    out.add("1", "check", True, "fine", 1.234)
    out.add("0", "fact", None, "x" * 500)
    lines = out.table().splitlines()
    assert "STAND-IN" in lines[0] and lines[1].split()[:4] == ["part", "check", "held", "seconds"]
    assert [line.split()[0] for line in lines[2:5]] == ["0", "1", "3"]
    assert "1.23" in lines[3] and " yes " in lines[3]
    assert " NO " in lines[4] and "4 files differ" in lines[4] and "more" not in lines[4]
    assert lines[2].endswith("…") and len(lines[2]) < 300
    assert lines[-1] == "result: 1 check(s) did not hold (exit 1)"
    doc = out.to_json()
    assert doc["exit_code"] == 1 and doc["rows"][0]["detail"].endswith("more")  # JSON keeps it all


def test_the_hang_timeout_leaves_room_for_a_healthy_build() -> None:
    assert gpu_check.hang_timeout(None) == 60
    assert gpu_check.hang_timeout(3.2) == 30
    assert gpu_check.hang_timeout(25.1) == 61
    assert gpu_check.hang_timeout(0.1, floor_s=5, margin_s=3) == 5


def test_the_gpu_with_the_most_free_memory_is_chosen_unless_one_is_named() -> None:
    table = [gpu.Gpu(0, "A", "GPU-0", 70000, 81559), gpu.Gpu(1, "A", "GPU-1", 10, 81559),
             gpu.Gpu(2, "A", "GPU-2", 10, 81559)]
    assert gpu_check.choose_gpu(table, None).index == 1  # a tie goes to the lower index
    assert gpu_check.choose_gpu(table, 0).index == 0
    with pytest.raises(ValueError, match=r"--gpu 5: nvidia-smi lists GPUs \[0, 1, 2\]"):
        gpu_check.choose_gpu(table, 5)


def test_the_smokes_device_is_matched_to_nvidia_smis_gpu_by_uuid_else_by_name() -> None:
    g = gpu.Gpu(3, "NVIDIA H100 80GB HBM3", "GPU-3f1c2a9e-8b7d-4c21-9e0a-1d2b3c4d5e6f", 0, 81559)
    assert gpu_check.same_device({"uuid": "GPU-3F1C2A9E-8B7D-4C21-9E0A-1D2B3C4D5E6F", "name": "x"}, g)
    assert not gpu_check.same_device({"uuid": "GPU-7a2b4c6d-1e3f-4a5b-8c9d-0e1f2a3b4c5d", "name": g.name}, g)
    assert gpu_check.same_device({"uuid": None, "name": g.name}, g)
    assert not gpu_check.same_device({"name": "NVIDIA A100"}, g)


def test_the_recipes_are_valid_rewheel_recipes(tmp_path: Path) -> None:
    path = tmp_path / "oom.toml"
    path.write_text(gpu_stage.recipe_text(name="oom", python=tmp_path / "env" / "bin" / "python",
                                          index_url="http://127.0.0.1:5/oom", backend="torch", timeout_s=45,
                                          gpus=1, free_mib=1024))
    r = load_recipe(path, check_interpreter=False)
    assert r.smoke is not None and (r.smoke.gpus, r.smoke.timeout_s, r.smoke.gpu_free_mib) == (1, 45, 1024)
    assert r.smoke.command == ("{python}", "gpu_smoke.py", "--backend", "torch", "smoke", "--model", "model")
    assert r.install.packages == (gpu_stage.KNOB,) and r.install.index_url == "http://127.0.0.1:5/oom"
    assert r.install.reinstall == "named" and r.service is None


def test_every_build_has_its_own_version_and_a_mode_the_smoke_knows() -> None:
    versions = [v for v, _ in gpu_stage.BUILDS.values()]
    assert len(set(versions)) == len(versions)
    assert {m for _, m in gpu_stage.BUILDS.values()} == set(gpu_smoke.MODES)
    assert set(gpu_check.EXPECTED_ERROR) < set(gpu_stage.BUILDS)


def test_the_smoke_facts_are_read_from_its_output() -> None:
    text = ("noise\ngpu_smoke: START {\"mode\": \"ok\"}\ngpu_smoke: READY {\"since_start_s\": 1.5}\n"
            "gpu_smoke: READY {\"since_start_s\": 2.5}\ngpu_smoke: BROKEN {not json\n"
            "(Worker) gpu_smoke: DEVICE {}\n")
    facts = gpu_stage.smoke_facts(text)
    assert facts == {"START": {"mode": "ok"}, "READY": {"since_start_s": 2.5}}


def test_the_newest_wheel_of_a_project_is_picked(tmp_path: Path) -> None:
    for v in ("0.9.0", "0.13.10", "0.13.9"):
        build_wheel(tmp_path, "uv", v, {"uv/__init__.py": ""})
    build_wheel(tmp_path, "uv-extra", "9.0", {"uv_extra/__init__.py": ""})
    (tmp_path / "not-a-wheel.whl").write_text("")
    assert gpu_stage.newest_wheel(tmp_path, "uv").name == "uv-0.13.10-py3-none-any.whl"
    assert gpu_stage.newest_wheel(tmp_path, "rewheel") is None


def test_commands_get_their_own_state_no_foreign_index_and_the_chosen_gpu(tmp_path: Path) -> None:
    env = gpu_stage.child_env(tmp_path, "3", {"PATH": "/bin", "UV_INDEX_URL": "http://x", "PIP_INDEX_URL": "y",
                                              "HF_TOKEN": "t", "PYTHONPATH": "/src", "CUDA_VISIBLE_DEVICES": "0,1",
                                              "REWHEEL_FAKE_ROOT": "/fake", "REWHEEL_HOME": "/elsewhere"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["PATH"] == "/bin"
    assert env["REWHEEL_HOME"] == str(tmp_path / "home") and env["REWHEEL_FAKE_ROOT"] == "/fake"
    assert env["HF_HUB_OFFLINE"] == "1" and env["UV_NO_CONFIG"] == "1"
    assert not {"UV_INDEX_URL", "PIP_INDEX_URL", "HF_TOKEN", "PYTHONPATH"} & set(env)
    assert "CUDA_VISIBLE_DEVICES" not in gpu_stage.child_env(tmp_path, None, {"CUDA_VISIBLE_DEVICES": "0"})


def test_tree_changes_name_added_removed_and_changed_entries(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("a")
    (tmp_path / "pkg" / "link").symlink_to("a.py")
    before = gpu_stage.tree_hashes(tmp_path)
    assert gpu_stage.tree_changes(before, gpu_stage.tree_hashes(tmp_path)) == []
    (tmp_path / "pkg" / "a.py").write_text("b")
    (tmp_path / "pkg" / "a.py").chmod(0o600)
    (tmp_path / "pkg" / "link").unlink()
    (tmp_path / "pkg" / "link").symlink_to("b.py")
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    changed = gpu_stage.tree_changes(before, gpu_stage.tree_hashes(tmp_path))
    assert changed == ["pkg/__pycache__/a.cpython-312.pyc", "pkg/a.py", "pkg/link"]
    assert [c for c in changed if not gpu_stage.is_bytecode(c)] == ["pkg/a.py", "pkg/link"]


def test_the_model_checkpoint_check_names_what_is_missing(tmp_path: Path) -> None:
    cfg = dict(gpu_smoke.SHAPES["standin"])
    names = gpu_smoke.llama_tensors(cfg)
    assert len(names) == 3 + 9 * cfg["num_hidden_layers"]
    assert names["model.layers.0.self_attn.k_proj.weight"] == [32, 64]  # grouped-query: 2 of 4 heads
    header = {k: {"dtype": "F32", "shape": v, "data_offsets": [0, 0]} for k, v in names.items()
              if k != "lm_head.weight"}
    blob = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(len(blob).to_bytes(8, "little") + blob)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        gpu_smoke.check_checkpoint(tmp_path)
