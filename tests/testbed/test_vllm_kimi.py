"""The vLLM GPU kit's Kimi-shaped phase (``testbed/gpu/vllm_kimi.py``) without a GPU: the Llama fallback target's
widths, each server's command line, and what the runner reads of a draft checkpoint and a trace summary."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from testbed.gpu import kimi_models, vllm_kimi


def test_the_llama_target_has_the_kimi_widths_and_the_aux_layers():
    c = vllm_kimi.llama_target_config(kimi_models.KIMI)
    assert (c["architectures"], c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]) == (
        ["LlamaForCausalLM"], 7168, 61, 163840)
    assert c["num_attention_heads"] * c["head_dim"] == 7168 and (c["num_attention_heads"], c["num_key_value_heads"]) == (
        56, 8)
    assert max(kimi_models.AUX_IDS) < c["num_hidden_layers"] and c["intermediate_size"] == 2048
    per_layer = 7168 * 128 * (56 + 8 + 8) + 56 * 128 * 7168 + 3 * 7168 * 2048
    assert 2 * (61 * per_layer + 2 * 163840 * 7168) < 26e9  # bf16 bytes: one 80 GB card with the draft and the KV


def test_each_variant_serves_with_its_attention_and_the_draft_from_its_checkpoint(tmp_path):
    mla = vllm_kimi.command(tmp_path, "mla", "kimi-aux-off", 8000)
    spec = json.loads(mla[mla.index("--speculative-config") + 1])
    assert spec["model"] == str(tmp_path / "kimi-aux-off") and spec["draft_load_config"] == {"load_format": "safetensors"}
    assert mla[mla.index("--model") + 1] == str(tmp_path / "target")
    assert mla[mla.index("--attention-backend") + 1] == "TRITON_MLA"
    assert json.loads(mla[mla.index("--attention-config") + 1]) == {"mla_prefill_backend": "CPU"}
    llama = vllm_kimi.command(tmp_path, "llama", "kimi-healthy", 8000)
    assert llama[llama.index("--model") + 1] == str(tmp_path / "target-llama")
    assert llama[llama.index("--attention-backend") + 1] == "TRITON_ATTN" and "--attention-config" not in llama
    for cmd in (mla, llama):
        assert "--enforce-eager" not in cmd and cmd[cmd.index("--load-format") + 1] == "dummy"


def test_the_seed_case_reads_the_trained_width_from_the_checkpoint(tmp_path):
    draft = tmp_path / "kimi-aux-off"
    draft.mkdir()
    save_file({"fc.weight": torch.zeros(4, 12)}, str(draft / kimi_models.WEIGHTS))
    save_file({"d2t": torch.zeros(3, dtype=torch.int64)}, str(draft / kimi_models.VOCAB))
    records = {"widths": {"draft.input@prefill": [4], "draft.input@draft_extend": [4], "target.aux[0]@verify": [4]}}
    assert vllm_kimi.seed_case(draft, records) == {"draft_input_widths": [4], "trained_fc_in": 12, "fc_sampled": False}
    assert vllm_kimi.trained_fc_in(tmp_path) is None


def test_the_dry_run_configs_are_the_device_models_configs(tmp_path):
    made = vllm_kimi.write_configs(tmp_path)
    read = lambda name: json.loads((made / name / "config.json").read_text())  # noqa: E731
    assert read("target") == kimi_models.target_config(kimi_models.KIMI)
    assert read("kimi-healthy") == kimi_models.draft_config(kimi_models.KIMI)
    assert read("kimi-aux-off")["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [20, 40, 60],
                                                    "use_aux_hidden_state": False}
