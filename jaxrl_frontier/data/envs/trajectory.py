"""Token layout of multi-turn episodes: prompt | action 0 | observation 1 | action 1 | ...

A multi-turn rollout stores each episode as one row, in the layout every objective reads
(`rl.experience`): the prompt LEFT-padded to a common width P, then the rest of the episode
(actions and observations, interleaved) RIGHT-padded to a common width C, T = P + C.

    tokens          int32 [B, T]  pad_id on padding
    attention_mask  int32 [B, T]  1 on real tokens
    loss_mask       f32   [B, T]  1 on the tokens the policy sampled (actions), 0 on the
                                  prompt, observations and padding: observations are
                                  context, never sampled and never trained on
    turn_index      int32 [B, T]  the turn a token belongs to: action k is turn k, the prompt
                                  and the observation before action k also count as turn k
                                  (the context of that turn); padding 0
    turns           int32 [B]     actions per row

`turn_index` and `loss_mask` are what `rl.critic.turn_rewards_to_tokens`,
`rl.step_credit.steps_to_tokens` and `progress_step_scores` take.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def episode_row(
    actions: Sequence[Sequence[int]], observations: Sequence[Sequence[int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One episode's (tokens, loss_mask, turn_index) after the prompt, unpadded, each [L].

    `actions[k]` are turn k's sampled ids (its stop token included when sampled);
    `observations[k]` the ids appended after action k (the environment's answer and the chat
    markup up to the next generation prompt); the last action may have no observation after
    it (len(observations) is len(actions) or len(actions) - 1).
    """
    if len(observations) not in (len(actions), len(actions) - 1):
        raise ValueError(
            f"episode_row: {len(observations)} observations for {len(actions)} actions "
            "(one after each action, the last optional)"
        )
    tokens, mask, turn = [], [], []
    for k, action in enumerate(actions):
        tokens += list(action)
        mask += [1.0] * len(action)
        turn += [k] * len(action)
        if k < len(observations):
            tokens += list(observations[k])
            mask += [0.0] * len(observations[k])
            turn += [k + 1] * len(observations[k])
    return (
        np.asarray(tokens, np.int32),
        np.asarray(mask, np.float32),
        np.asarray(turn, np.int32),
    )


def pack(
    prompts: Sequence[Sequence[int]],
    episodes: Sequence[tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]],
    pad_id: int,
    prompt_width: int | None = None,
    completion_width: int | None = None,
) -> dict[str, np.ndarray]:
    """B episodes, each (actions, observations) after prompts[b], in the module's layout.

    prompt_width / completion_width: P and C (default: the longest of the batch); a row
    longer than its width is an error naming the row.
    """
    if len(prompts) != len(episodes):
        raise ValueError(f"pack: {len(prompts)} prompts for {len(episodes)} episodes")
    rows = [episode_row(a, o) for a, o in episodes]
    P = max(len(p) for p in prompts) if prompt_width is None else prompt_width
    C = max(len(r[0]) for r in rows) if completion_width is None else completion_width
    B = len(rows)
    tokens = np.full((B, P + C), pad_id, np.int32)
    attn = np.zeros((B, P + C), np.int32)
    loss = np.zeros((B, P + C), np.float32)
    turn = np.zeros((B, P + C), np.int32)
    turns = np.zeros(B, np.int32)
    for b, (prompt, (toks, m, k)) in enumerate(zip(prompts, rows)):
        if len(prompt) > P or len(toks) > C:
            raise ValueError(
                f"pack: row {b} has a prompt of {len(prompt)} and {len(toks)} episode tokens; "
                f"the widths are {P} and {C}"
            )
        tokens[b, P - len(prompt) : P] = prompt
        attn[b, P - len(prompt) : P + len(toks)] = 1
        tokens[b, P : P + len(toks)] = toks
        loss[b, P : P + len(toks)] = m
        turn[b, P : P + len(toks)] = k
        turns[b] = len(episodes[b][0])
    return {
        "tokens": tokens,
        "attention_mask": attn,
        "loss_mask": loss,
        "turn_index": turn,
        "turns": turns,
    }
