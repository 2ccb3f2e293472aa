"""An environment seen as a task: the examples are environment seeds, the prompt is the first
observation, the rewards are the episode's.

A run with an `env` config block (`env.name` set) trains on episodes: the prompt source
draws examples as for any task (`{"index": i, "seed": s}`), the multi-turn producer
(`rl.agent_rollout`) plays G episodes per seed, and evaluation plays greedy and sampled
episodes on held-out seeds (`evaluate`). Train and eval seeds never overlap: a seed is eval
iff a stable hash of (environment name, seed) falls below `eval_fraction`, the test
`envs.split_seeds` uses, so the split holds for every run seed.

Reward vector per episode (`ENV_REWARD_NAMES`): `return`, the summed turn rewards, and
`success`, 1.0 when the episode reached its goal. An empty `objective.reward_weights`
weighs the return alone.
"""

from __future__ import annotations

from jaxrl_frontier.data.envs.base import env_from_config
from jaxrl_frontier.data.tasks.base import Example, Task, check_split, hash_unit

ENV_REWARD_NAMES = ("return", "success")
CREDITS = ("episode", "gigpo", "3spo")  # env.credit: how episode rewards become advantages


def section_get(section, key, default=None):
    get = section.get if hasattr(section, "get") else lambda k, d=None: getattr(section, k, d)
    return get(key, default)


class EnvTask(Task):
    """Seeds of one environment as task examples (module docstring).

    Args:
      env: the `env` config block (name, module, kwargs, observation_template, eval_fraction,
        train_size, eval_size).
    """

    name = "environment"
    reward_names = ENV_REWARD_NAMES
    evaluation = "episodes"  # evaluated by playing episodes from the eval seeds

    def __init__(self, env, chat=None, tokenizer=None, system: str = ""):
        self.section = env
        # an instruct model's chat template (`task.chat_template`): the first observation is
        # the user's message, each later one the text that closes the assistant's turn and
        # opens the next (`ChatTemplate.turn_text`)
        self.chat, self.tokenizer, self.system = chat, tokenizer, system or None
        self.env_name = section_get(env, "name")
        self.env = env_from_config(env)  # one instance: prompts are reset's observations
        self.template = section_get(env, "observation_template", "{observation}")
        self.eval_fraction = float(section_get(env, "eval_fraction", 0.1))
        self.sizes = {
            "train": int(section_get(env, "train_size", 1_000_000)),
            "eval": int(section_get(env, "eval_size", 10_000)),
        }

    def split_of(self, seed: int) -> str:
        eval_ = hash_unit(f"env|{self.env_name}|{seed}") < self.eval_fraction
        return "eval" if eval_ else "train"

    def seed_of(self, split: str, index: int) -> int:
        """The seed at `index` of `split` (drawn from (split, index) until it hashes into the
        split: O(1) per index, unlike walking `split_seeds`)."""
        for draw in range(1000):
            seed = int(hash_unit(f"envtask|{split}|{index}|{draw}") * 2**31)
            if self.split_of(seed) == split:
                return seed
        raise RuntimeError(
            f"env: no {split} seed in 1000 draws (eval_fraction {self.eval_fraction})"
        )

    def num_examples(self, split: str) -> int:
        return self.sizes[check_split(split)]

    def example(self, split: str, index: int) -> Example:
        check_split(split)
        return {"index": int(index), "seed": self.seed_of(split, int(index))}

    def observation_text(self, observation: str) -> str:
        """An observation after a turn of the policy, as the policy reads it: formatted by
        `env.observation_template`; with a chat template, the rest of the assistant's turn,
        the observation as the user's message and the next generation prompt."""
        text = self.template.format(observation=observation)
        if self.chat is None:
            return text
        history = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
        return self.chat.turn_text(self.tokenizer, history, [{"role": "user", "content": text}])

    def first_text(self, observation: str) -> str:
        """The episode's first observation as the prompt (in the chat template, if any)."""
        text = self.template.format(observation=observation)
        return text if self.chat is None else self.chat.prompt(text, system=self.system)

    def prompt(self, example: Example) -> str:
        return self.first_text(self.env.reset(int(example["seed"])))

    def demonstration(self, example: Example) -> str:
        """One of `env.demonstrations`, drawn from the example's index: SFT on these clones
        a uniformly random policy over those actions (a warm start that can act at all)."""
        options = tuple(section_get(self.section, "demonstrations", ()) or ())
        if not options:
            raise NotImplementedError(
                f"environment {self.env_name!r}: mode='sft' needs config key "
                "'env.demonstrations' (the action texts to clone)"
            )
        return options[int(hash_unit(f"envdemo|{example['index']}") * len(options))]

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        raise NotImplementedError(
            f"environment {self.env_name!r}: rewards come from playing episodes "
            "(rl.produce.agent), not from scoring one completion"
        )


def check_env_config(env) -> tuple[str, ...]:
    """The `env` section of a run config, checked on its own (ConfigError naming the key);
    returns the reward names an env run has. What spans sections (the keys an environment
    run refuses, 3SPO's source) is run/'s to check."""
    from jaxrl_frontier.core.errors import ConfigError
    from jaxrl_frontier.data.envs.base import ENVS, load_env_module

    e = env
    try:
        load_env_module(e.module)
    except (ImportError, OSError) as err:
        raise ConfigError(f"config key 'env.module' = {e.module!r}: {err}") from None
    if e.name not in ENVS.names():
        raise ConfigError(f"config key 'env.name' = {e.name!r}; allowed: {', '.join(ENVS.names())}")
    if e.credit not in CREDITS:
        raise ConfigError(f"config key 'env.credit' = {e.credit!r}; allowed: {', '.join(CREDITS)}")
    for key in ("max_turns", "turn_tokens", "obs_tokens"):
        if getattr(e, key) < 1:
            raise ConfigError(f"config key 'env.{key}' = {getattr(e, key)} must be >= 1")
    if e.max_tokens < 0:
        raise ConfigError(f"config key 'env.max_tokens' = {e.max_tokens} must be >= 0 (0: none)")
    return ENV_REWARD_NAMES
