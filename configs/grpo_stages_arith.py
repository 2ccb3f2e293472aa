"""GRPO on 3-digit addition whose capacity grows in stages while its KL penalty decays.

    python scripts/train.py --config=configs/grpo_stages_arith.py \
        --workdir=runs/grpo_stages_arith --config.model.path=runs/sft_arith

LLMZero ("LLMZero: Discovering Adaptive Training Strategies for RL Post-Training via LLM
Agents") finds that good runs grow their capacity knobs stage by stage (group size,
completion budget, prompt batch) while their regularisation knobs move with the training.
Here (docs/methods.md, "Stages"):

    steps    1-300   8 completions x 16 prompts a step
    steps  301-600  16 completions x 16 prompts   (a group's baseline from twice the samples)
    steps  601-800  16 completions x 32 prompts
    kl_coef(s) = cosine(0.05, 0.005) over the 800 steps

Each boundary recompiles the rollout and the update once; a run cut on either side of one
resumes in its stage. The runlocal variant starts the stages at steps 1, 2, ... so its
2-step run crosses the first boundary.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.schedules.objective.kl_coef = "cosine(0.05, 0.005)"
    c.stages = (
        dict(step=300, overrides={"rollout.group_size": 16}),
        dict(step=600, overrides={"data.prompt_batch": 32}),
    )
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=800, minibatches=2, log_every=10, eval_every=100, checkpoint_every=100)
    c.eval.update(num_prompts=256, pass_k=4)
    return presets.finish(c, arg)
