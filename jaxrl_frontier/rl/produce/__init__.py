"""Stage 2, rollout producers: prompts in, one `Experience` out (sampling or environment
episodes, then editors, rewards, log-prob passes, advantages and metrics).

Importing the package registers the built-in rollout editors (`editors.py`, `EDITORS`) and
log-prob passes (`passes.py`, `PASSES`); a new editor or pass in a file of its own here is
imported below.
"""

# ruff: noqa: F401  (imported for their registrations)
from jaxrl_frontier.rl.produce import editors, passes
