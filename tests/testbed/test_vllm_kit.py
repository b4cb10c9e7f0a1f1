"""The vLLM GPU kit without a GPU: its schemas are the release binary's, its tree keeps vLLM's Python and
drops the binaries, and a built kit installs and dry-runs here (``testbed/gpu/vllm_serve.py --dry-run``:
vLLM's CUDA path imported with the platform taken as one H200, each mode's engine configuration built by
vLLM's own parser). Running it on the H200 is the device's part (docs/testbed.md)."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from testbed.gpu import kit_files, vllm_kit
from testbed.gpu.vllm_standins import vllm_c_standin

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / ".cache" / "vllm-gpu-kit"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def test_the_schemas_are_the_release_binarys_own():
    wheels = sorted(vllm_kit.RELEASE_CACHE.glob("vllm-0.32.0-*.whl"))
    if not wheels:
        pytest.skip(f"the {vllm_kit.VLLM} CUDA wheel is not cached in {vllm_kit.RELEASE_CACHE} "
                    "(python -m testbed.gpu.vllm_kit --schemas downloads it)")
    assert vllm_kit.extract_schemas(wheels[-1]) == vllm_c_standin.read_schemas()


@pytest.mark.parametrize("name,kept", [
    ("vllm/model_executor/models/llama_eagle3.py", True),
    ("vllm/model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H100.json", True),
    ("vllm-0.32.0.dist-info/METADATA", True),
    ("vllm-0.32.0.dist-info/RECORD", False),
    ("vllm/_C_stable_libtorch.abi3.so", False),
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", False),
    ("vllm/vllm-rs", False),
    ("vllm/third_party/deep_gemm/include/deep_gemm/common/utils.cuh", False),
    ("vllm/third_party/fmha_sm100/cute/interface.py", False),
    ("vllm/vllm_flash_attn/cute/interface.py", False),
])
def test_the_tree_keeps_vllms_python_and_drops_its_binaries(name, kept):
    assert vllm_kit.keep_in_tree(name) is kept


def test_the_overlay_holds_the_stand_ins_entry_points():
    names = sorted(p.relative_to(vllm_kit.OVERLAY).as_posix() for p in vllm_kit.OVERLAY.rglob("*.py"))
    assert names == ["vllm/_C_stable_libtorch.py", "vllm/vllm_flash_attn/_vllm_fa2_C.py"]


def test_a_built_kit_installs_and_dry_runs_here(tmp_path):
    if not (KIT / "manifest.json").exists():
        pytest.skip(f"no vLLM kit at {KIT}: python -m testbed.gpu.build_kit --engine vllm")
    if not VLLM_PYTHON.exists():
        pytest.skip("the dry run imports vLLM's CUDA tree with .venv-vllm's libraries (scripts/build-vllm-venv)")
    manifest = json.loads((KIT / "manifest.json").read_text())
    assert manifest["size_mib"] <= kit_files.LIMIT_MIB
    assert len(manifest["wheels"]) == len(kit_files.pinned_wheels(REPO / "testbed" / "gpu" / "vllm_wheels.txt"))

    env = {**os.environ, "KIT_INSTALL_ONLY": "1", "KIT_ROOT": str(tmp_path / "root"), "OUT": str(tmp_path / "out"),
           "PYTHON": str(REPO / ".venv" / "bin" / "python")}
    done = subprocess.run(["bash", str(KIT / "run.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "root" / "site"
    installed = {p.name.split("-")[0].lower().replace("_", "-") for p in site.glob("*.dist-info")}
    assert {w.split("-")[0].lower().replace("_", "-") for w in manifest["wheels"]} <= installed
    assert (site / "vllm" / "_C_stable_libtorch.py").exists() and not list(site.glob("vllm/*.so"))

    tree = tmp_path / "tree"  # the tree alone: the site's cp312 binaries do not load on this Python 3.11
    with tarfile.open(KIT / "vllm.tar.xz") as tar:
        tar.extractall(tree, filter="data")
    path = os.pathsep.join([str(KIT / "standins"), str(tmp_path / "root" / "tracer"), str(tree), str(KIT / "src")])
    done = subprocess.run([str(VLLM_PYTHON), "-m", "testbed.gpu.vllm_serve", "--kit", str(KIT), "--work",
                           str(tmp_path / "work"), "--dry-run", "--kimi", "--throughput", "--modes", "graphs,eager"],
                          env={**os.environ, "PYTHONPATH": path},
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    results = json.loads((tmp_path / "work" / "results.json").read_text())
    imports = results["imports"]
    assert imports["vllm"] == "0.32.0" and imports["vllm_from"].startswith(str(tree))
    assert imports["platform"].endswith("CudaPlatform")
    assert [m for m, r in imports["modules"].items() if not r["ok"]] == []
    assert imports["standins"]["ran"] == ["_C::cutlass_scaled_mm_supports_block_fp8"]  # asked at import, says no
    graphs, eager = results["engine_configs"]["graphs"], results["engine_configs"]["eager"]
    assert (graphs["compile_mode"], graphs["cudagraph_mode"]) == ("3", "FULL_AND_PIECEWISE")
    assert (eager["compile_mode"], eager["cudagraph_mode"]) == ("0", "NONE")
    for config in (graphs, eager):
        assert config["custom_ops"] == ["none"] and config["attention_backend"].endswith("TRITON_ATTN")
        assert config["ir_op_priority"]["rms_norm"][0] == "native" and config["fusion_passes_on"] == []
        assert config["speculative"] == ["eagle3", 3] and config["v2_model_runner"] is False
    kimi = results["kimi"]  # the Kimi-shaped phase's servers at full width (testbed/gpu/vllm_kimi.py)
    assert set(kimi) == {"mla/kimi-healthy", "mla/kimi-aux-off", "llama/kimi-healthy", "llama/kimi-aux-off"}
    for name, config in kimi.items():
        assert (config["compile_mode"], config["cudagraph_mode"], config["dtype"]) == ("3", "FULL_AND_PIECEWISE",
                                                                                      "torch.bfloat16"), name
        assert config["aux_ids_read"] == [20, 40, 60] and config["draft_load_format"] == "safetensors", name
        assert config["draft_architectures"] == ["LlamaForCausalLMEagle3"] and config["prefix_caching"] is False
    assert (kimi["mla/kimi-healthy"]["target_attention_selected"], kimi["mla/kimi-healthy"]["mla_prefill_selected"]) \
        == ("TRITON_MLA", "CPU_SDPA_MLA")
    assert kimi["llama/kimi-aux-off"]["target_attention_selected"] == "TRITON_ATTN"
    tiny = results["engine_configs"]["throughput"]  # the throughput phase's servers: a 1 GiB KV cache each
    assert (tiny["max_num_seqs"], tiny["kv_cache_memory_bytes"]) == (64, 1 << 30)
    wide = results["kimi_throughput"]  # --throughput --kimi: three Kimi-width servers on one H200
    assert (wide["architectures"], wide["compile_mode"], wide["cudagraph_mode"]) == \
        (["LlamaForCausalLM"], "3", "FULL_AND_PIECEWISE")
    assert wide["capture_sizes"] == [4, 8, 16, 32, 64, 128, 256]  # 1, 8 and 64 verifies of 4 tokens
    assert wide["aux_ids_read"] == [20, 40, 60]
    assert (wide["max_num_seqs"], wide["gpu_memory_utilization"], wide["kv_cache_memory_bytes"]) == (64, 0.28, 4 << 30)
