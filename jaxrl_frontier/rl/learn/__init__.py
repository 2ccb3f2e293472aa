"""Stage 4, the learner: forwards over split weights, the train state and microbatched update,
the optimizer, and the `Learner` that applies one RL update to an `Experience`."""
