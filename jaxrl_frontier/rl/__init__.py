"""The RL step as stages: `RolloutProducer` (rollout.py) -> `Experience` (experience.py) ->
`Learner` (learner.py). The loop that wires them is `jaxrl_frontier.trainer`."""
