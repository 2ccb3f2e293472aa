"""GGUF files read as Hugging Face checkpoints (models/gguf_file.py), on a tiny file written
here with llama.cpp's writer (the `gguf` package) in llama.cpp's layout: its tensor names,
Llama's Q/K rows permuted as llama.cpp's converter permutes them, f32 and Q8_0 blocks. The
real checkpoints' parity with transformers: tests/models/test_pretrained.py."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch

from jaxrl_frontier.core.errors import ModelFileError
from jaxrl_frontier.models import gguf_file, hf

gguf = pytest.importorskip("gguf", reason="the models extra: pip install '.[models]'")

HF = dict(vocab=64, hidden=32, ffn=64, layers=2, heads=4, kv_heads=2)


def llama_cpp_permute(w, heads):
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute`."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # 2 heads of 4 rows
    permuted = llama_cpp_permute(w, 2)
    # head 0's rows (0, 1, 2, 3) -> (0, 2, 1, 3): rotate-half pairs (j, j + d/2) interleaved
    np.testing.assert_array_equal(permuted[:4, 0], [0, 6, 3, 9])
    np.testing.assert_array_equal(gguf_file._unpermute(permuted, 2), w)


def write_tiny_llama(path, tensors: dict, quantize_q8: bool):
    """A GGUF of a tiny Llama from HF-named f32 tensors, written as llama.cpp does."""
    h = HF
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(h["layers"])
    w.add_context_length(128)
    w.add_embedding_length(h["hidden"])
    w.add_feed_forward_length(h["ffn"])
    w.add_head_count(h["heads"])
    w.add_head_count_kv(h["kv_heads"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(h["vocab"])
    back = {v: k for k, v in gguf_file._LAYER_TENSORS.items()}
    for name, t in tensors.items():
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers.") :].split(".", 1)
            key = f"blk.{i}.{back[rest]}"
        else:
            key = {v: k for k, v in gguf_file._GLOBAL_TENSORS.items()}[name]
        if name.endswith("q_proj.weight"):
            t = llama_cpp_permute(t, h["heads"])
        elif name.endswith("k_proj.weight"):
            t = llama_cpp_permute(t, h["kv_heads"])
        kind = gguf.GGMLQuantizationType.F32
        if quantize_q8 and t.ndim == 2:
            t, kind = (
                gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0),
                gguf.GGMLQuantizationType.Q8_0,
            )
        w.add_tensor(key, np.ascontiguousarray(t), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(HF dir, its tensors) of a tiny random transformers Llama (untied head)."""
    import torch
    import transformers

    h = HF
    cfg = transformers.LlamaConfig(
        vocab_size=h["vocab"], hidden_size=h["hidden"], intermediate_size=h["ffn"],
        num_hidden_layers=h["layers"], num_attention_heads=h["heads"],
        num_key_value_heads=h["kv_heads"], rms_norm_eps=1e-5, max_position_embeddings=128,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    d = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(d)
    return d, {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("q8", [False, True], ids=["f32", "q8_0"])
def test_tiny_gguf_loads_as_its_hf_checkpoint(tiny, tmp_path, q8):
    """f32 blocks: the logits of the HF directory exactly (same f32 weights); Q8_0 blocks:
    each weight w = q d (q an int8, d = max|w| / 127 a block of 32 stored in f16) within
    d / 2 of rounding plus |q| <= 127 times d's f16 rounding (2^-11 d)."""
    directory, tensors = tiny
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, tensors, quantize_q8=q8)
    ckpt = gguf_file.read(path)
    assert ckpt.hf_config["architectures"] == ["LlamaForCausalLM"]
    assert ckpt.hf_config["tie_word_embeddings"] is False
    for name, want in tensors.items():
        got = ckpt.tensor(name)
        bound = 0.0
        if q8 and want.ndim == 2:  # d = max|w| / 127 a block of 32, stored in f16
            d = np.abs(want.reshape(-1, 32)).max(1).repeat(32).reshape(want.shape) / 127
            bound = d * (0.5 + 127 * 2.0**-11)  # rounding to q d, plus q times d's f16 error
        assert np.all(np.abs(got - want) <= bound * (1 + 1e-3) + 1e-7), name
    if not q8:
        tokens, mask = left_padded_batch(batch=2, length=8, vocab=HF["vocab"])
        a = hf.load(path)(jnp.asarray(tokens), jnp.asarray(mask))
        b = hf.load(directory)(jnp.asarray(tokens), jnp.asarray(mask))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unsupported_architecture_and_missing_file_are_named(tmp_path):
    path = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="architecture 'mamba' is not supported"):
        gguf_file.read(path)
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        gguf_file.read(tmp_path / "missing.gguf")
