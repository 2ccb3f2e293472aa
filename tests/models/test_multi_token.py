"""The multi-token-prediction module (models/multi_token.py) against transformers, on the
tiny random DeepSeek-V3 of tests/tiny_deepseek.py with one module appended as DeepSeek-V3's
checkpoints hold it. transformers reads no such module, so the reference is assembled from
its parts: the policy's final-normed states and head from `DeepseekV3ForCausalLM`, the
fused input by the report's formula in torch, the block as a one-layer
`DeepseekV3ForCausalLM` given that input (its final norm the module's shared_head.norm).

Tolerance: as tests/models/test_deepseek_v3.py's, 1e-5 of the logits' scale: the module
adds one layer and a projection over 64 inputs to the policy's three layers.
"""

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import rel_diff
from flax import nnx
from tiny_deepseek import HF_DEEPSEEK, hf_model

from jaxrl_frontier.core.errors import ModelFileError
from jaxrl_frontier.models import hf
from jaxrl_frontier.models.multi_token import MultiTokenPredictor

REL_TOL = 1e-5
MTP_LAYER = HF_DEEPSEEK["num_hidden_layers"]  # the module's layer index in the checkpoint
TOKENS = np.random.RandomState(1).randint(1, 128, size=(1, 6)).astype(np.int32)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(the policy's directory, the same with a module appended, reference(tokens) -> the
    module's logits [1, T - 1, V]): the module is layer 3 (a transformers MoE decoder
    layer's tensors), enorm, hnorm, eh_proj, shared_head.norm and copies of the policy's
    embedding and head; config.json's num_nextn_predict_layers = 1."""
    import torch
    from safetensors.numpy import load_file, save_file

    out = tmp_path_factory.mktemp("multi_token")
    policy, block = hf_model(seed=0), hf_model(seed=1, num_hidden_layers=1, first_k_dense_replace=0)
    policy.save_pretrained(out / "policy")
    block.save_pretrained(out / "block")
    d = HF_DEEPSEEK["hidden_size"]
    own = {"enorm": 1.0 + 0.2 * torch.randn(d), "hnorm": 1.0 + 0.2 * torch.randn(d)}
    own["eh_proj"] = 0.3 * torch.randn(d, 2 * d)
    pre = f"model.layers.{MTP_LAYER}."
    tensors = {f"{pre}{n}.weight": w.numpy() for n, w in own.items()}
    for name, w in load_file(out / "block" / "model.safetensors").items():
        if name.startswith("model.layers.0."):
            tensors[name.replace("model.layers.0.", pre)] = w
    tensors[pre + "shared_head.norm.weight"] = block.model.norm.weight.detach().numpy()
    tensors[pre + "embed_tokens.weight"] = policy.model.embed_tokens.weight.detach().numpy()
    tensors[pre + "shared_head.head.weight"] = policy.lm_head.weight.detach().numpy()
    shutil.copytree(out / "policy", out / "with_mtp")
    save_file(tensors, out / "with_mtp" / "mtp.safetensors", metadata={"format": "pt"})
    with open(out / "with_mtp" / "config.json", "w") as f:
        json.dump({**hf.read_config(out / "policy"), "num_nextn_predict_layers": 1}, f)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + block.config.rms_norm_eps) * w

    def reference(tokens):
        t = torch.as_tensor(tokens, dtype=torch.long)
        with torch.no_grad():
            h = policy.model(input_ids=t).last_hidden_state[:, :-1]
            e = policy.model.embed_tokens(t[:, 1:])
            fused = torch.cat([rms(e, own["enorm"]), rms(h, own["hnorm"])], -1) @ own["eh_proj"].T
            g = block.model(inputs_embeds=fused).last_hidden_state
            return policy.lm_head(g).numpy()

    return out / "policy", out / "with_mtp", reference


def test_module_equals_transformers_parts_and_saves_both_ways(checkpoints, tmp_path):
    """The module, loaded by `hf.load_mtp`, gives the reference's logits; the policy loads
    from the same directory as from the one without the module (its tensors are not the
    policy's); save(policy, mtp=) writes back every tensor of the directory bitwise; a
    checkpoint whose config counts a module it lacks is refused naming the tensor."""
    from safetensors.numpy import load_file

    bare, path, reference = checkpoints
    policy, mtp = hf.load(path), hf.load_mtp(path)
    assert isinstance(mtp, MultiTokenPredictor) and not hasattr(mtp, "embed")
    for a, b in zip(jax.tree.leaves(nnx.state(policy)), jax.tree.leaves(nnx.state(hf.load(bare)))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    @jax.jit
    def ours(t):  # pairs (h_j, t_{j+1}) at positions 0..T-2
        h, _ = policy.hidden_states(t)
        g, _ = mtp(policy, t[:, 1:], h[:, :-1])
        return policy.logits(g)

    ref = reference(TOKENS)
    diff = rel_diff(np.asarray(ours(TOKENS)), ref, np.ones(ref.shape[:2], np.int32))
    print(f"MTP logits: max |diff| / max |logit| = {diff:.1e}")
    assert diff < REL_TOL

    hf.save(policy, tmp_path, mtp=mtp)
    assert hf.read_config(tmp_path)["num_nextn_predict_layers"] == 1
    saved, given = load_file(tmp_path / "model.safetensors"), {}
    for f in ("model.safetensors", "mtp.safetensors"):
        given.update(load_file(path / f))
    assert sorted(saved) == sorted(given)
    for name, w in given.items():
        np.testing.assert_array_equal(saved[name], w, err_msg=name)
    # (transformers writes num_nextn_predict_layers = 1, and no module's tensors)
    with pytest.raises(ModelFileError, match=r"'model\.layers\.3\.enorm\.weight' of its module 0"):
        hf.load_mtp(bare)


def test_module_follows_only_a_causal_lm_of_full_attention():
    from tiny_deepseek import CFG

    with pytest.raises(ValueError, match="causal LM of full attention"):
        nnx.eval_shape(lambda: MultiTokenPredictor(CFG.replace(num_labels=1), rngs=nnx.Rngs(0)))
