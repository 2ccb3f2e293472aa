"""The demo's RL config (configs/grpo_arith.py) from a random policy, no SFT start: the
correctness reward shaped by format and length, so a random policy's groups have advantages
from the first step (the tests' setting). A population benchmark's workload where no SFT
checkpoint is at hand (benchmarks/population.py --scratch).
"""

import importlib.util
import os

import ml_collections


def get_config(arg=None):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grpo_arith.py")
    spec = importlib.util.spec_from_file_location("grpo_arith", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config(arg)
    c.model.init, c.model.path = "scratch", ""
    c.objective.reward_weights = ml_collections.ConfigDict(
        dict(correctness=1.0, format=0.5, length=0.1)
    )
    c.optimizer.update(lr=5e-3, warmup_steps=0)
    return c
