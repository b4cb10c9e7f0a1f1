"""draftscope.spec: the draft/target readers on published config shapes and on bad input."""

from __future__ import annotations

import json
import os

import pytest
import torch

from draftscope.spec import SpecError, read_draft, read_target
from tests.spec_fixtures import (published, published_draft, tiny_draft_config, tiny_target,
                                 tiny_weights, write_draft)


def test_specforge_deepseek_v3_published_shape(tmp_path):
    config = published("specforge_deepseek_v3")
    draft = published_draft(tmp_path / "d", config)
    spec = read_draft(draft, target_layers=61)
    assert spec.source_format == "specforge"
    assert spec.aux_layer_ids == [1, 29, 57] and spec.aux_ids_location == "eagle_config"
    assert spec.aux_convention == "output_of" and spec.aux_layers_physical == [1, 29, 57]
    assert (spec.k, spec.expected_fc_in_width, spec.fc_in_features) == (3, 21504, 21504)
    assert (spec.hidden_size, spec.target_vocab_size, spec.draft_vocab_size) == (7168, 129280, 32000)
    assert spec.lm_head_rows == 32000 and spec.key_style == "midlayer"
    vm = spec.vocab_map
    assert vm.d2t_size == 32000 and vm.t2d_sum == 32000 and vm.t2d_matches_d2t
    assert vm.target_ids_in_range and not vm.looks_absolute
    assert spec.max_position_embeddings == 163840


def test_eagle_reference_llama31_8b(tmp_path):
    spec = read_draft(published_draft(tmp_path / "d", published("eagle_llama31_8b")), target_layers=32)
    assert spec.source_format == "eagle" and spec.architecture == "LlamaForCausalLM"
    assert spec.aux_layer_ids is None and spec.aux_layers_physical == [1, 15, 28]
    assert spec.expected_fc_in_width == 12288 and spec.max_position_embeddings == 2048
    assert spec.rope == {"theta": 500000.0, "scaling": None}


def test_speculators_layers0_keys(tmp_path):
    config = published("speculators_llama31_8b")
    spec = read_draft(published_draft(tmp_path / "d", config, style="layers.0"), target_layers=32)
    assert spec.source_format == "speculators" and spec.key_style == "layers.0"
    assert spec.hidden_size == 4096 and spec.target_vocab_size == 128256
    assert spec.norm_before_residual is False
    assert spec.verifier["name_or_path"] == "meta-llama/Meta-Llama-3.1-8B-Instruct"


def test_kimi_mla_draft_and_nested_target(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps(published("kimi_k25_target")))
    target = read_target(tmp_path / "t")
    assert target.architecture == "KimiK25ForConditionalGeneration" and target.text_config_nested
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (61, 7168, 163840)
    assert target.rope["scaling"]["type"] == "yarn"
    config = published("kimi_k25_eagle3_mla")
    config.update(intermediate_size=18432, num_key_value_heads=8)  # Llama-style sizes for the fixture
    spec = read_draft(published_draft(tmp_path / "d", config), target_layers=61)
    assert spec.source_format == "eagle3-mla" and spec.is_mla
    assert spec.aux_convention == "input_to" and spec.aux_layers_physical == [1, 29, 57]


def test_sharded_index_and_boundary_ids(tmp_path):
    tiny_target(tmp_path / "t", layers=8)
    write_draft(tmp_path / "d", tiny_draft_config(ids=[2, 5, 8]), tiny_weights(), shards=3)
    spec = read_draft(tmp_path / "d", target_layers=8)
    assert len(spec.keys) == 15 and spec.aux_convention == "boundary"
    assert spec.aux_layers_physical == [1, 4, 7]


def test_bin_only_when_asked(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(tiny_draft_config()))
    torch.save(tiny_weights(), d / "pytorch_model.bin")
    with pytest.raises(SpecError, match="pickled PyTorch checkpoint"):
        read_draft(d)
    spec = read_draft(d, allow_bin=True)
    assert spec.fc_in_features == 384 and spec.vocab_map.t2d_matches_d2t


@pytest.mark.parametrize("corrupt, match", [
    (b"\x01\x02", "shorter than the 8-byte"),
    ((10 ** 12).to_bytes(8, "little"), "impossible"),
    ((40).to_bytes(8, "little") + b"{not json", "truncated"),
    ((9).to_bytes(8, "little") + b"{not json", "not JSON"),
])
def test_corrupt_safetensors_header(tmp_path, corrupt, match):
    d = write_draft(tmp_path / "d", tiny_draft_config(), tiny_weights())
    (d / "model.safetensors").write_bytes(corrupt)
    with pytest.raises(SpecError, match=match) as err:
        read_draft(d)
    assert err.value.path.endswith("model.safetensors")


def test_bad_config_inputs(tmp_path):
    d = write_draft(tmp_path / "d", tiny_draft_config(), tiny_weights())
    (d / "config.json").write_text("{\"architectures\": [")
    with pytest.raises(SpecError, match="not valid JSON"):
        read_draft(d)
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 8}))
    with pytest.raises(SpecError, match="not an EAGLE-3 draft"):
        read_draft(d)
    with pytest.raises(SpecError, match="does not exist"):
        read_target(tmp_path / "missing")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(SpecError, match="lacks num_hidden_layers, hidden_size, vocab_size"):
        read_target(tmp_path / "t")


def test_header_only_on_large_checkpoint(tmp_path):
    """A 7168-wide published draft is ~2 GB of weights; reading it must not touch them."""
    draft = published_draft(tmp_path / "d", published("specforge_deepseek_v3"))
    size = (draft / "model.safetensors").stat().st_size
    assert size > 1_500_000_000
    assert os.stat(draft / "model.safetensors").st_blocks * 512 < 50_000_000  # sparse: never written
    read_draft(draft, target_layers=61)
