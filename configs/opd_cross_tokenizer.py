"""On-policy distillation across tokenizers: Gemma-3-270M teaches SmolLM2-135M-Instruct on
reasoning-gym arithmetic.

    python scripts/fetch_model.py smollm2-135m-instruct      # once each
    python scripts/fetch_model.py gemma-3-270m
    python scripts/train.py --config=configs/opd_cross_tokenizer.py --workdir=runs/opd_x

The student samples in its own tokens (SmolLM2's 49k byte-level BPE); the teacher reads the
same text in its own (Gemma's 262k SentencePiece): the prompt and the completion are
decoded and re-tokenized, the teacher scores its tokens in one forward, and each student
token gets the summed log-probability of the teacher tokens whose text ends in it
(`teacher.tokenizer = 'own'`, docs/objectives.md). The OPD advantage is then the per-token
a_t = l_teacher(y_t) - l_student(y_t), with the policy-gradient weight w = 1, as in
`configs/opd_arith.py`. A full-vocabulary loss (`objective.distill`) needs one vocabulary
and is refused with this teacher.

`runlocal`: the same models and task, 2 steps of 2 prompts x 8 completions of 16 tokens.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.pretrained_rl("smollm2-135m-instruct", max_digits=2, arg=arg)
    c.model.update(hidden_size=576, intermediate_size=1536)  # the checkpoint's
    c.teacher.update(init="hf", path="gemma-3-270m", tokenizer="own", token_ratio=2.0)
    c.objective.update(advantage="opd", weight="pg", aggregation="token_mean")
    c.objective.advantage_kwargs = dict(estimator="immediate")
    c.objective.weight_kwargs = {}
    c.optimizer.lr = 2e-6
    c.train.update(steps=40, eval_every=40)
    c.eval.num_prompts = 512
    c = presets.finish_pretrained(c, arg)
    if arg == "runlocal":
        c.data.prompt_batch = 2
    return c
