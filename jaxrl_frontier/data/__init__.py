"""What the policy is trained on: tasks (prompts, references, reward functions, grain prompt
pipelines, chat templates), multi-turn environments, and the reward scorers with the sandbox
for model-written code. Imports only `core` (and never `rl`)."""
