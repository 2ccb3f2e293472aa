"""GRPO on SmolLM2-135M-Instruct with an LLM judge beside the verifiable reward, on
reasoning-gym arithmetic.

    python scripts/fetch_model.py smollm2-135m-instruct      # once
    python scripts/train.py --config=configs/judge_reasoning.py --workdir=runs/judge

The policy is `configs/smollm2_reasoning.py`'s; the judge is SmolLM2-135M-Instruct too (its
own copy, frozen): it reads each completion with the question and the reference answer
under the judge prompt, in its chat template, and its probability of answering "yes" rather
than "no" (`judge.mode = 'yes_prob'`), standardized over each prompt's group, is the reward
component `judge`: r = 1.0 * correctness + 0.5 * format + 0.5 * judge. A 135M judge is a
weak one (docs/methods.md, "An LLM judge"): the config shows the wiring on a real
checkpoint, not a judge worth trusting.

`runlocal`: the same models and task, 2 steps of 2 prompts x 8 completions of 16 tokens,
judge prompts of up to 192 tokens.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.pretrained_rl("smollm2-135m-instruct", max_digits=2, arg=arg)
    c.model.update(hidden_size=576, intermediate_size=1536)  # the checkpoint's
    c.judge.update(
        init="hf", path="smollm2-135m-instruct", mode="yes_prob", normalize="group", max_len=384
    )
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, judge=0.5)
    c.optimizer.lr = 2e-6
    c.train.update(steps=40, eval_every=40)
    c.eval.num_prompts = 512
    c = presets.finish_pretrained(c, arg)
    if arg == "runlocal":
        c.data.prompt_batch = 2
        c.judge.max_len = 192
    return c
