"""The rollout / update log-prob mismatch of a tiny random Qwen3-MoE, without routing replay,
with R3 (the rollout's recorded experts) and with R2 (the first training forward's experts).

    PYTHONPATH=. python benchmarks/moe_replay_mismatch.py [--seeds 3] [--dtype bfloat16] [--lr 1e-4]
        [--out artifacts/moe_replay_mismatch_cpu.json]

The sampler (recording each token's experts) draws completions at the weights theta_0; the
update-side forward scores them over the full sequences, in two places:

  first: the step's first update forward, at theta_0. 'none' routes with the router;
    'rollout' (R3) replays the sampler's experts; 'first_update' (R2) replays the experts of
    this very forward, so it equals 'none' here by construction (R2 records them).
  later: a later minibatch or epoch of the same step, at theta_1 = theta_0 plus one Adam
    first step (lr x sign of the gradient of the sampled tokens' mean log-prob). 'none'
    routes with theta_1's router, 'rollout' replays the sampler's experts, 'first_update'
    the experts of the forward at theta_0.

Per seed, mode and place: the max and mean |log p_update - log p_rollout| over the
completion tokens (at `later` this includes the policy's own change, the same in every
mode), and the share of recorded (token, layer) pairs routed to other experts than the
rollout's (`diff_vs_rollout`) and, at `later`, than the first forward's (`diff_vs_first`);
at `later` also the max and mean over the completion tokens whose router at theta_1 picks
other experts (in some layer) than the first forward or the rollout did (`*_on_flipped`):
where a forward that follows its router jumps and a replaying one need not.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.common import machine_info, write_json
from jaxrl_frontier.models import moe
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.objectives.logprobs import token_logprobs
from jaxrl_frontier.sampling import Sampler, SamplingParams
from jaxrl_frontier.sampling.sampler import recorded_experts

SHAPE = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
    num_kv_heads=2, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=32,
    norm_topk_prob=True, qk_norm=True, family="qwen3_moe",
)  # fmt: skip
PROMPTS, PROMPT_LEN, N, NEW_TOKENS = 8, 12, 4, 24


def run(seed: int, dtype: str, lr: float) -> dict:
    model = Transformer(ModelConfig(**SHAPE, dtype=dtype), rngs=nnx.Rngs(seed))
    graphdef, theta0 = nnx.split(model)
    rng = np.random.RandomState(seed)
    prompts = rng.randint(1, 128, size=(PROMPTS, PROMPT_LEN)).astype(np.int32)
    sampler = Sampler(model, pad_id=0, prompt_buckets=(16,), record_routing=True)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, n=N, temperature=1.0)
    ro = sampler.generate(prompts, np.ones_like(prompts), params, jax.random.key(seed))
    seq = ro.sequences()
    scored = jnp.asarray(seq.loss_mask) > 0

    @jax.jit
    def score(params, routing):
        """(log-probs [B, T], the experts used [B, T, L, k], -1 on padding)."""
        m = nnx.merge(graphdef, params)
        hidden, _, stats = m.hidden_states(
            seq.tokens, seq.attention_mask, routing=routing, router_stats=True
        )
        used = recorded_experts(stats.experts, seq.attention_mask)
        return token_logprobs(m.logits(hidden), seq.tokens), used

    @jax.jit
    def adam_first_step(params):  # reinforce the sampled tokens: lr x sign(grad mean logp)
        mean_logp = lambda p: jnp.sum(jnp.where(scored, score(p, None)[0], 0.0)) / scored.sum()
        grads = jax.grad(mean_logp)(params)
        return jax.tree.map(lambda p, g: p + lr * jnp.sign(g).astype(p.dtype), params, grads)

    recorded = jnp.all(ro.routing >= 0, axis=(-2, -1))
    share = lambda a, b: float(moe.routing_difference_share(a, b, recorded))
    first_routing = score(theta0, None)[1]  # R2's record: the first update forward's experts
    theta1 = adam_first_step(theta0)
    # completion tokens whose own routing at theta_1 differs (in any layer, as a set) from
    # the first forward's or the rollout's: where a mode without replay jumps
    own1 = np.sort(np.asarray(score(theta1, None)[1]), -1)
    moved = lambda rec: np.any(own1 != np.sort(np.asarray(rec), -1), axis=(-2, -1))
    flipped = np.asarray(scored) & (moved(first_routing) | moved(ro.routing))
    replays = {"none": None, "rollout": ro.routing, "first_update": first_routing}
    out = {}
    for place, params in (("first", theta0), ("later", theta1)):
        for mode, routing in replays.items():
            logp, used = score(params, routing)
            diff = np.abs(np.asarray(logp) - np.asarray(seq.old_logp))[np.asarray(scored)]
            row = dict(max=float(diff.max()), mean=float(diff.mean()))
            row["diff_vs_rollout"] = share(used, ro.routing)
            if place == "later":
                row["diff_vs_first"] = share(used, first_routing)
                on = np.abs(np.asarray(logp) - np.asarray(seq.old_logp))[flipped]
                row.update(
                    flipped_tokens=int(flipped.sum()),
                    scored_tokens=int(diff.size),
                    max_on_flipped=float(on.max()),
                    mean_on_flipped=float(on.mean()),
                )
            out[f"{place}/{mode}"] = row
    return out


def describe(r: dict) -> str:
    """One line of a mode's figures."""
    text = (
        f"logp mismatch max {r['max']:.4f} mean {r['mean']:.5f}; (token, layer) pairs on "
        f"other experts than the rollout {r['diff_vs_rollout']:.2%}"
    )
    if "diff_vs_first" in r:
        text += (
            f", than the first forward {r['diff_vs_first']:.2%}; on the {r['flipped_tokens']} "
            f"of {r['scored_tokens']} tokens routed otherwise at theta_1: max "
            f"{r['max_on_flipped']:.4f} mean {r['mean_on_flipped']:.5f}"
        )
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--out", default="artifacts/moe_replay_mismatch_cpu.json")
    args = p.parse_args()
    seeds = {}
    for seed in range(args.seeds):
        seeds[seed] = run(seed, args.dtype, args.lr)
        for name, r in seeds[seed].items():
            print(f"seed {seed} {name:20s}: {describe(r)}")
    shape = dict(SHAPE, prompts=PROMPTS, prompt_len=PROMPT_LEN, n=N, new_tokens=NEW_TOKENS)
    result = dict(
        benchmark="moe_replay_mismatch", dtype=args.dtype, lr=args.lr, shape=shape,
        seeds=seeds, **machine_info(),
    )  # fmt: skip
    write_json(result, args.out, echo=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
