"""jaxrl_frontier: RL post-training of language models in JAX.

Data flows one way: config -> data -> sampler -> rewards -> objectives -> update ->
metrics/checkpoint. See DESIGN in the README.
"""

__version__ = "0.1.0"
