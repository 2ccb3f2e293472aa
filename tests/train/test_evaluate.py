"""scripts/evaluate.py: the rerankers and best-of-n by hand, the entropy of known and random
logits, and the script end to end on a tiny exported policy."""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_rl_config

from jaxrl_frontier.models import hf
from jaxrl_frontier.run import build as build_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("evaluate", os.path.join(REPO, "scripts/evaluate.py"))
ev = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ev)


def test_rerankers_by_hand():
    logp = np.asarray([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    ref = np.asarray([[-2.0, -2.0, -9.0], [-1.0, -1.0, -1.0]])
    mask = np.asarray([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    np.testing.assert_allclose(ev.progress(logp, ref, mask), [1.0, 1.5])  # masked -9 ignored
    np.testing.assert_allclose(ev.confidence(logp, ref, mask), [-1.5, -0.5])
    np.testing.assert_allclose(ev.no_rerank(logp, ref, mask), [0.0, 0.0])
    with pytest.raises(ValueError, match="--reference"):
        ev.progress(logp, None, mask)


def test_best_of_n_picks_the_top_score_first_on_ties():
    correct = np.asarray([[0, 1, 0], [1, 0, 0], [0, 0, 1]], np.float32)
    scores = np.asarray([[0.1, 0.9, 0.3], [0.2, 0.2, 0.5], [1.0, 1.0, 1.0]])
    assert ev.best_of_n(correct, scores) == pytest.approx(1 / 3)  # picks 1, 2, 0
    assert ev.best_of_n(correct, np.zeros((3, 3))) == pytest.approx(1 / 3)  # the first: 0,1,0


def test_token_entropy_of_uniform_and_peaked_logits():
    v = 8
    uniform = jnp.zeros((1, 3, v))
    mask = jnp.asarray([[0, 1, 1]])
    assert float(ev.token_entropy(uniform, mask)) == pytest.approx(np.log(v), rel=1e-6)
    peaked = jnp.full((1, 3, v), -1e4).at[..., 0].set(0.0)
    assert float(ev.token_entropy(peaked, mask)) == pytest.approx(0.0, abs=1e-6)


def test_token_entropy_is_the_masked_mean_of_the_packages_entropy():
    """Random logits [2, 4, 5], position t predicting t + 1: the mean of numpy's
    -sum p log p over the predicted tokens the mask holds (column 0, predicted by nothing,
    left out although its mask is 1)."""
    logits = np.random.RandomState(0).normal(size=(2, 4, 5)) * 2
    mask = np.asarray([[1, 1, 0, 1], [0, 1, 1, 1]])
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    h = -(p * np.log(p)).sum(-1)  # [2, 4]: h[:, t] the entropy predicting token t + 1
    want = (h[:, :-1] * mask[:, 1:]).sum() / mask[:, 1:].sum()
    got = float(ev.token_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(mask)))
    assert got == pytest.approx(want, rel=1e-5)


def test_the_script_end_to_end_on_an_exported_policy(tmp_path):
    c = small_rl_config()
    tok = build_lib.build_tokenizer(c)
    mesh = build_lib.build_mesh(c)
    model = build_lib.build_model("scratch", "", c, tok, mesh, jax.random.key(0), "float32")
    path = str(tmp_path / "policy")
    hf.save(model, path)
    tok.save(path)
    cfg = tmp_path / "cfg.py"
    tests = os.path.join(REPO, "tests")
    cfg.write_text(
        f"import sys\nsys.path.insert(0, {tests!r})\nfrom conftest import small_rl_config\n"
        "def get_config():\n    c = small_rl_config()\n    c.eval.update(batch=8)\n    return c\n"
    )
    out = tmp_path / "eval.json"
    res = ev.main(
        ["evaluate.py", f"--config={cfg}", f"--policy={path}", f"--reference={path}", "--n=4",
         "--rerank=progress,confidence,none", "--num_prompts=8", "--entropy", f"--json={out}"]
    )  # fmt: skip
    saved = json.loads(out.read_text())
    assert saved["best_of_4/confidence"] == res["best_of_4/confidence"]
    assert res["prompts"] == 8 and 0 <= res["pass@1_greedy"] <= 1
    assert res["mean_correct_sampled"] <= res["pass@4"]
    # policy == reference: every progress score is 0, so it picks the first sample, as none
    assert res["best_of_4/progress"] == res["best_of_4/none"]
    v = build_lib.model_config_from(c, tok).vocab_size
    assert 0 < res["entropy"] <= np.log(v) + 1e-4
    # --n=0: the greedy pass alone, the same figure (greedy decoding at the same prompts)
    greedy = ev.main(
        ["evaluate.py", f"--config={cfg}", f"--policy={path}", "--n=0", "--num_prompts=8"]
    )
    assert greedy == {"pass@1_greedy": res["pass@1_greedy"], "prompts": 8.0}
