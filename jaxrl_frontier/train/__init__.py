"""What every run shares, RL or SFT: the SFT step, evaluation, checkpoints, metrics writers and
stop rules."""
