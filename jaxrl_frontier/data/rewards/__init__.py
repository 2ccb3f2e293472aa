"""Rewards: the scorer interface (in process or in worker processes), reward shaping names and
weights, and the sandbox that runs model-written code outside the trainer's process."""
