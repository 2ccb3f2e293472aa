"""The RL step as stages, one folder per stage (docs/design.md):

- `sources/`: stage 1, which prompts a step trains on (the `PromptSource` protocol and its
  registry: uniform, dynamic, ADS, ZPPO, 3SPO);
- `produce/`: stage 2, prompts to an `Experience` (sampling or environment episodes, rollout
  editors, rewards, log-prob passes, advantages);
- `credit.py`: stage 3, rewards to advantages;
- `learn/`: stage 4, the jitted, donated update;
- `methods/`: methods that add a part to several stages (PPO's critic, PACT, step-level
  credit, self-conditioning);
- `experience.py`: the records that travel between stages.
"""
