"""benchmarks/sampler_mismatch.py: the mismatch figures by hand, and each setting's rollout
scored by the learner on a tiny checkpoint."""

import numpy as np

from benchmarks import sampler_mismatch


def test_mismatch_by_hand():
    """d = learner - sampler on the masked tokens: (0, -0.5) -> max 0.5, mean 0.25,
    K3 = ((e^0 - 1 - 0) + (e^-0.5 - 1 + 0.5)) / 2 = 0.0532653."""
    out = sampler_mismatch.mismatch([0.0, -1.0, -2.0], [0.0, -1.5, -9.0], [1, 1, 0])
    assert (out["max"], out["mean"], out["tokens"]) == (0.5, 0.25, 2)
    np.testing.assert_allclose(out["k3"], (np.exp(-0.5) - 0.5) / 2, rtol=1e-12)


def test_a_bf16_sampler_is_further_from_the_f32_learner_than_the_f32_sampler(
    tmp_path, tiny_model_args
):
    """A tiny random checkpoint (`tiny_model_args`), 2 prompts x 2 completions of 4 tokens:
    the f32 sampler's recorded log-probs are the learner's up to f32 rounding (decode and full forward sum in
    other orders: about 1e-6 here), the bf16 sampler's differ by bf16 rounding (8 bits of
    mantissa: about 1e-2)."""
    import jax

    from benchmarks import common, sampler
    from jaxrl_frontier.models import hf
    from jaxrl_frontier.sampling import SamplingParams

    config = common.load_config(tiny_model_args, sampler.DEFAULT_CONFIG)
    hf.save(sampler.build_model(config), str(tmp_path), dtype="float32")
    model = hf.load(str(tmp_path), dtype="float32", param_dtype="float32")
    learner = sampler_mismatch.learner_logprobs(model)
    tokens = np.array([[5, 6, 7], [0, 8, 9]], np.int32)  # left-padded
    mask = (np.arange(3) >= np.array([[0], [1]])).astype(np.int32)
    params = SamplingParams(max_new_tokens=4, n=2, temperature=1.0)
    f32, bf16 = (
        sampler_mismatch.measure(model, learner, tokens, mask, params, s, jax.random.key(0))
        for s in ("f32", "sampler_bf16")
    )
    assert f32["tokens"] == bf16["tokens"] == 2 * 2 * 4
    assert (f32["sampler_dtype"], bf16["sampler_dtype"]) == ("float32", "bfloat16")
    assert f32["max"] < 1e-4
    assert bf16["mean"] > 10 * f32["mean"] and bf16["max"] < 0.5
