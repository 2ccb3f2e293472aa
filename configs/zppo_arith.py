"""GRPO with ZPPO's hard-prompt replay on 3-digit addition.

    python scripts/train.py --config=configs/zppo_arith.py --workdir=runs/zppo_arith

ZPPO ("Zone of Proximal Policy Optimization: Teacher in Prompts, Not Gradients"): prompts
whose group accuracy is < 0.5 enter a FIFO replay buffer (data.zppo.capacity) and come back
as a quarter of each batch, alternately as BCQ ("<a>,<b>;123+456=": the reference answer
and one wrong student answer, unlabelled, in a seeded order) and NCQ ("not <w1>,<w2>;
123+456=": the student's wrong answers), until their accuracy reaches 0.5 (graduation).
The reference answer is the teacher's greedy answer when the run has a teacher and that
answer is verified correct (e.g. --config.teacher.init=hf --config.teacher.path=DIR), else
the task's own. Logged: zppo/buffer_size, zppo/graduations, zppo/evictions, zppo/replayed
(and zppo/teacher_references with a teacher).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.data.source = "zppo"
    c.data.zppo.update(capacity=64, replay_fraction=0.25, max_wrong=2)
    c.data.max_prompt_len = 32  # BOS + "not wwwww,wwwww;123+456=" fits
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=300, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50)
    return presets.finish(c, arg)
