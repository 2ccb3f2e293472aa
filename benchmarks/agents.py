"""Multi-turn rollouts against single-turn rollouts of the same total tokens.

    python benchmarks/bench.py agents
    python benchmarks/bench.py agents --rows 64 --turns 6 --turn-tokens 8 --obs-tokens 48

Same random model, same rows, same prompt width, one process, alternating, medians over
repeats (the first call of each compiles and is not timed):

  multi-turn   `TurnSession`: prefill the prompts, then `turns` turns of `turn-tokens`
               sampled tokens each (no stop token: every row runs to the cap), an
               observation of `obs-tokens` random ids prefilled after every turn but the
               last; the host loop and its transfers are timed, environments are not
               (their cost is theirs)
  single-turn  `Sampler.generate` with max_new_tokens = every token the episode adds
               (turns x turn-tokens + (turns - 1) x obs-tokens), all of them decoded
  same split   `Sampler.generate` of a prompt holding the prompt and every observation
               token (prefilled at once) and turns x turn-tokens decoded: the same tokens
               prefilled and decoded as the episode, in one piece

Tokens per second count every token after the prompt (sampled and observed) on every
side; `ratio` is the multi-turn seconds over the single-turn seconds (the target: at most
about 1.3), `ratio_same_split` over the same-split rollout's (the cost of taking turns:
decoding in pieces, observations prefilled between them, the host loop).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=32, help="episodes (rows) per rollout")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--turn-tokens", type=int, default=8)
    p.add_argument("--obs-tokens", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=48)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)


def bench_agents(args) -> dict:
    """Multi-turn (TurnSession) vs single-turn (Sampler) rollout tokens/s, same total tokens."""
    import jax
    import numpy as np

    from benchmarks import common
    from jaxrl_frontier.models.model_config import ModelConfig
    from jaxrl_frontier.models.random_init import random_model
    from jaxrl_frontier.sampling import Sampler, SamplingParams
    from jaxrl_frontier.sampling.turns import TurnSession

    cfg = ModelConfig(
        vocab_size=64, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        num_layers=args.layers, num_heads=4, num_kv_heads=2, max_position_embeddings=2048,
    )  # fmt: skip
    model = random_model(cfg, seed=0)
    sampler = Sampler(model, pad_id=0, prompt_buckets=(args.prompt_len,))
    rows, k, ta, to = args.rows, args.turns, args.turn_tokens, args.obs_tokens
    rng = np.random.RandomState(0)
    prompts = rng.randint(1, cfg.vocab_size, size=(rows, args.prompt_len)).astype(np.int32)
    mask = np.ones_like(prompts)
    obs = [rng.randint(1, cfg.vocab_size, size=to).tolist() for _ in range(rows)]
    episode_tokens = k * ta + (k - 1) * to
    turn = SamplingParams(max_new_tokens=ta, n=1, temperature=1.0)
    session = TurnSession(sampler, turn, obs_tokens=to, max_turns=k)
    single = SamplingParams(max_new_tokens=episode_tokens, n=1, temperature=1.0)
    long_prompt = args.prompt_len + (k - 1) * to  # the prompt and every observation
    split_sampler = Sampler(model, pad_id=0, prompt_buckets=(long_prompt,))
    split_prompts = rng.randint(1, cfg.vocab_size, size=(rows, long_prompt)).astype(np.int32)
    split = SamplingParams(max_new_tokens=k * ta, n=1, temperature=1.0)

    def multi_turn(seed=0):
        session.start(prompts, mask, jax.random.key(seed))
        for t in range(k):
            _, _, lengths = session.turn([ta] * rows)
            if t < k - 1:
                session.append(obs)
        assert int(lengths.sum()) == rows * ta
        jax.block_until_ready(session.cache)

    def single_turn(seed=0):
        ro = sampler.generate(prompts, mask, single, jax.random.key(seed))
        jax.block_until_ready(ro.completion_tokens)

    def same_split(seed=0):
        ro = split_sampler.generate(
            split_prompts, np.ones_like(split_prompts), split, jax.random.key(seed)
        )
        jax.block_until_ready(ro.completion_tokens)

    sides = dict(multi_turn=multi_turn, single_turn=single_turn, same_split=same_split)
    for run in sides.values():  # compile each
        run()
    times = {name: [] for name in sides}
    for r in range(args.repeats):  # alternating: a load change hits every side alike
        for name, run in sides.items():
            times[name].append(common.median_time(lambda: run(r), 1)[0])
    med = {name: float(np.median(t)) for name, t in times.items()}
    tokens = rows * episode_tokens
    return dict(
        settings=dict(
            rows=rows,
            turns=k,
            turn_tokens=ta,
            obs_tokens=to,
            prompt_len=args.prompt_len,
            hidden=args.hidden,
            layers=args.layers,
            repeats=args.repeats,
        ),  # fmt: skip
        tokens_per_rollout=tokens,
        sampled_tokens_multi_turn=rows * k * ta,
        seconds=med,
        tokens_per_second={name: tokens / s for name, s in med.items()},
        ratio=med["multi_turn"] / med["single_turn"],
        ratio_same_split=med["multi_turn"] / med["same_split"],
        times=times,
        machine=common.machine_info(),
    )
