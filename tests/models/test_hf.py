"""HF checkpoints: logit parity with transformers, save round trips, error messages.

Tiny random Llama / Qwen2 / Qwen3 models are built offline from configs (conftest.HF_CASES)
and saved with `save_pretrained`; every comparison uses a left-padded batch and looks at
real positions only.
"""

import importlib.util
import json
import os
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import HF_CASES, hf_logits, left_padded_batch
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxrl_frontier.models import hf

TOL = 1e-4  # f32 logits, max |ours - transformers| over real positions


def _ours(model, tokens, mask) -> np.ndarray:
    return np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))


def _max_diff(a, b, mask) -> float:
    return float(np.abs(a - b)[mask.astype(bool)].max())


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_logit_parity_and_round_trip(case, hf_checkpoints, tmp_path):
    from transformers import AutoModelForCausalLM

    path, torch_model = hf_checkpoints(case)
    tokens, mask = left_padded_batch()
    ref = hf_logits(torch_model, tokens, mask)

    model = hf.load(path)
    got = _ours(model, tokens, mask)
    assert got.shape == ref.shape == (*tokens.shape, 128)
    diff = _max_diff(got, ref, mask)
    print(f"{case}: max |logit diff| = {diff:.2e} (max |logit| {np.abs(ref).max():.2f})")
    assert diff < TOL, f"{case}: max |logit diff| {diff} vs transformers"

    # Our save -> transformers loads it and gives the same logits.
    out = tmp_path / "saved"
    hf.save(model, out, base_config=hf.read_config(path))
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(reloaded).__name__ == type(torch_model).__name__
    assert _max_diff(hf_logits(reloaded, tokens, mask), ref, mask) < TOL
    # Tied models store no lm_head, as transformers does.
    has_head = "lm_head.weight" in load_file(out / "model.safetensors")
    assert has_head == (not model.cfg.tie_word_embeddings)


def test_sharded_save_loads_back(hf_checkpoints, tmp_path):
    from transformers import AutoModelForCausalLM

    path, torch_model = hf_checkpoints("qwen3")
    tokens, mask = left_padded_batch()
    model = hf.load(path)
    out = tmp_path / "sharded"
    hf.save(model, out, max_shard_size="100KB")
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) > 1 and "model.safetensors.index.json" in files
    assert "model.safetensors" not in files
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert {n for s in hf.tensor_specs(model.cfg) for n in [s.hf_name]} == set(index["weight_map"])

    ref = hf_logits(torch_model, tokens, mask)
    assert _max_diff(_ours(hf.load(out), tokens, mask), ref, mask) < TOL
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert _max_diff(hf_logits(reloaded, tokens, mask), ref, mask) < TOL

    # Saving again as one file replaces the shards (no stale files left behind).
    hf.save(model, out)
    assert sorted(f for f in os.listdir(out) if "safetensors" in f) == ["model.safetensors"]


def test_bfloat16_save_and_load(hf_checkpoints, tmp_path):
    path, _ = hf_checkpoints("llama")
    model = hf.load(path)
    out = tmp_path / "bf16"
    hf.save(model, out, dtype="bfloat16")
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    assert (
        str(load_file(out / "model.safetensors")["model.embed_tokens.weight"].dtype) == "bfloat16"
    )

    # Parameters stay f32 by default; values are the bf16-rounded originals, exactly.
    back = hf.load(out)
    for (p, a), (_, b) in zip(
        nnx.to_flat_state(nnx.state(model, nnx.Param)),
        nnx.to_flat_state(nnx.state(back, nnx.Param)),
    ):
        a, b = np.asarray(a.get_value()), np.asarray(b.get_value())
        assert b.dtype == np.float32, p
        np.testing.assert_array_equal(b, a.astype(jnp.bfloat16).astype(np.float32), err_msg=str(p))

    # dtype= sets the compute dtype only.
    fast = hf.load(path, dtype="bfloat16")
    assert fast.cfg.dtype == "bfloat16" and fast.embed.get_value().dtype == jnp.float32
    # param_dtype= stores them in bf16 (as read from an f32 checkpoint).
    small = hf.load(path, param_dtype="bfloat16")
    assert small.cfg.param_dtype == "bfloat16" and small.embed.get_value().dtype == jnp.bfloat16
    tokens, mask = left_padded_batch()
    ref = _ours(model, tokens, mask)
    got = _ours(fast, tokens, mask)
    assert _max_diff(got, ref, mask) < 0.05 * np.abs(ref).max()


def test_convert_script(hf_checkpoints, tmp_path, capsys):
    path, _ = hf_checkpoints("qwen2")
    script = Path(__file__).parents[2] / "scripts" / "convert_hf.py"
    spec = importlib.util.spec_from_file_location("convert_hf", script)
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    out = tmp_path / "converted"
    diff = convert.main(["--in", str(path), "--out", str(out)])
    assert diff < TOL
    printed = capsys.readouterr().out
    assert "parameters" in printed and "max |logit diff|" in printed
    assert hf.read_config(out)["architectures"] == ["Qwen2ForCausalLM"]
    assert hf.read_config(out).get("bos_token_id") == hf.read_config(path).get("bos_token_id")


# ----------------------------------------------------------------------------- errors


@pytest.fixture
def llama_copy(hf_checkpoints, tmp_path):
    """A writable copy of the tiny Llama checkpoint."""
    src, _ = hf_checkpoints("llama")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_error_unsupported_architecture(llama_copy):
    _edit_config(llama_copy, architectures=["MistralForCausalLM"])
    with pytest.raises(
        ValueError,
        match=r"unsupported architecture 'MistralForCausalLM'.*LlamaForCausalLM, Qwen2ForCausalLM, .*Qwen3ForCausalLM",
    ):
        hf.load(llama_copy)


def test_error_missing_tensor(llama_copy):
    file = llama_copy / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(
        KeyError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' is missing .*ckpt"
    ):
        hf.load(llama_copy)


def test_error_unexpected_tensor(llama_copy):
    file = llama_copy / "model.safetensors"
    tensors = load_file(file)
    tensors["model.layers.0.mlp.gate_proj.bias"] = np.zeros(128, np.float32)
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"does not use: \['model.layers.0.mlp.gate_proj.bias'\]"):
        hf.load(llama_copy)


def test_error_shape_mismatch(llama_copy):
    _edit_config(llama_copy, intermediate_size=96)
    with pytest.raises(
        ValueError,
        match=r"tensor 'model.layers.0.mlp.gate_proj.weight' in 'model.safetensors': expected shape \(96, 64\).*found \(128, 64\)",
    ):
        hf.load(llama_copy)


def test_error_missing_config(llama_copy):
    (llama_copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no config.json in checkpoint directory .*ckpt"):
        hf.load(llama_copy)
    with pytest.raises(FileNotFoundError, match=r"directory .*nowhere' does not exist"):
        hf.load(llama_copy / "nowhere")


def test_error_no_safetensors(llama_copy):
    (llama_copy / "model.safetensors").rename(llama_copy / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors files .*pytorch_model.bin"):
        hf.load(llama_copy)


def test_error_missing_shard_file(hf_checkpoints, tmp_path):
    model = hf.load(hf_checkpoints("llama")[0])
    hf.save(model, tmp_path, max_shard_size="100KB")
    shard = sorted(f for f in os.listdir(tmp_path) if f.startswith("model-"))[1]
    (tmp_path / shard).unlink()
    with pytest.raises(FileNotFoundError, match=rf"names '{shard}', which is missing"):
        hf.load(tmp_path)
