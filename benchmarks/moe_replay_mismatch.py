"""The rollout / update log-prob mismatch of a tiny random Qwen3-MoE in bf16, with and
without routing replay (R3).

    python benchmarks/moe_replay_mismatch.py [--seeds 3]

The sampler (recording each token's experts) draws completions; the update-side forward
scores them over the full sequences, once with the router's own choice and once replaying
the recorded experts. Prints, per seed, the max and mean |log p_update - log p_rollout| over
the completion tokens and the share of recorded (token, layer) pairs routed to other experts
than the rollout (0 with replay, by construction).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_frontier.models import moe
from jaxrl_frontier.models.layers import ModelConfig
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.objectives.logprobs import token_logprobs
from jaxrl_frontier.sampling import Sampler, SamplingParams

CFG = ModelConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
    num_kv_heads=2, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=32,
    norm_topk_prob=True, qk_norm=True, family="qwen3_moe", dtype="bfloat16",
)  # fmt: skip


def run(seed: int) -> dict:
    model = Transformer(CFG, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    rng = np.random.RandomState(seed)
    prompts = rng.randint(1, 128, size=(8, 12)).astype(np.int32)
    sampler = Sampler(model, pad_id=0, prompt_buckets=(16,), record_routing=True)
    params = SamplingParams(max_new_tokens=24, n=4, temperature=1.0)
    ro = sampler.generate(prompts, np.ones_like(prompts), params, jax.random.key(seed))
    seq = ro.sequences()

    @jax.jit
    def score(params, routing):
        m = nnx.merge(graphdef, params)
        hidden, _, stats = m.hidden_states(
            seq.tokens, seq.attention_mask, routing=routing, router_stats=True
        )
        return token_logprobs(m.logits(hidden), seq.tokens), jnp.moveaxis(stats.experts, 0, 2)

    scored = np.asarray(seq.loss_mask) > 0
    out = {}
    for name, routing in (("own", None), ("replay", ro.routing)):
        logp, used = score(state, routing)
        diff = np.abs(np.asarray(logp) - np.asarray(seq.old_logp))[scored]
        recorded = jnp.all(ro.routing >= 0, axis=(-2, -1))
        share = float(moe.routing_difference_share(used, ro.routing, recorded))
        out[name] = (float(diff.max()), float(diff.mean()), share)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    for seed in range(p.parse_args().seeds):
        for name, (mx, mean, share) in run(seed).items():
            print(
                f"seed {seed} {name:6s}: logp mismatch max {mx:.4f} mean {mean:.5f}, "
                f"other experts than the rollout on {share:.2%} of (token, layer) pairs"
            )


if __name__ == "__main__":
    main()
