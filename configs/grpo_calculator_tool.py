"""GRPO on calculator tool use: arithmetic word problems over several turns.

    python scripts/train.py --config=configs/grpo_calculator_tool.py --workdir=runs/calc \
        --config.model.init=hf --config.model.path=PATH --config.tokenizer.kind=hf \
        --config.tokenizer.path=PATH
    python scripts/train.py --config=configs/grpo_calculator_tool.py:runlocal --workdir=/tmp/x

Each episode is one word problem (`data/envs/calculator.py`): a turn either calls the calculator,
`{calc 3*(4+5)}`, and gets `{= 27}` back, or answers, `{ans 27}`, which ends the episode
with reward 1 if right (markers in braces: the character tokenizer has no `<` or `>`). Up
to 4 turns of 16 tokens, G = 8 episodes per problem, GRPO on the episode returns. The
calculator's results are observations (never trained on). A model that does not already
write the call and answer syntax earns no reward: start from one that does (an instruct
model, or an SFT warm start); the default scratch model only exercises the pipeline. The
runlocal variant poses problems with numbers up to 2 and starts from
`data/warm_starts/calculator` (scripts/make_warm_starts.py), which answers at once with one
of the four commonest answers: right on about a quarter, so its groups disagree and a
two-step run trains.
"""

from jaxrl_frontier.run.config import base_config, presets

SYNTAX = dict(
    call_open="{calc ",
    call_close="}",
    result_open="{= ",
    result_close="}",
    answer_open="{ans ",
    answer_close="}",
)


def get_config(arg=None):
    c = base_config()
    c.env.update(name="calculator", max_turns=4, turn_tokens=16, obs_tokens=40, max_tokens=256)
    c.env.kwargs = dict(max_number=50, syntax=SYNTAX)
    c.data.update(prompt_batch=8, max_prompt_len=192)  # BOS + the longest problem (187)
    c.rollout.update(group_size=8, max_new_tokens=16, temperature=1.0)
    c.model.update(max_position_embeddings=512)
    c.objective.reward_weights = {"return": 1.0}
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.optimizer.update(lr=1e-5, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=200, log_every=5, eval_every=50, checkpoint_every=50)
    c.eval.update(num_prompts=128, pass_k=2, batch=64)
    return presets.finish(c, arg)
