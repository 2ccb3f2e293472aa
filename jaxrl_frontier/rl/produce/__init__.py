"""Stage 2, rollout producers: prompts in, one `Experience` out (sampling or environment
episodes, then editors, rewards, log-prob passes, advantages and metrics)."""
