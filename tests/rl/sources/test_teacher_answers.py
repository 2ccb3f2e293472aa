"""Teacher answers (rl/sources/teacher_answers.py): the teacher's greedy completions decoded
and scored, only the verified ones kept (what ZPPO's BCQ prompts use as references)."""

import numpy as np
from conftest import SMALL_MODEL, random_model

from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.tokenizer import CharTokenizer


def test_teacher_answers_keep_only_verified_greedy_answers():
    """The teacher's greedy completions decoded and scored: the one the scorer accepts is
    returned (stripped), the other None."""
    import jax

    from jaxrl_frontier.models.text import decode
    from jaxrl_frontier.rl.sources.teacher_answers import TeacherAnswers
    from jaxrl_frontier.sampling import Sampler, SamplingParams

    tok = CharTokenizer()
    model = random_model(ModelConfig(vocab_size=tok.vocab_size, **SMALL_MODEL))

    class FirstOnly:
        reward_names = ("correctness",)

        def __call__(self, examples, texts):
            return np.asarray([[1.0]] + [[0.0]] * (len(texts) - 1)), 0

    task = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=")
    examples = [task.example("train", i) for i in (0, 1)]
    answers = TeacherAnswers(model, tok, task, FirstOnly(), max_prompt_len=5, max_new_tokens=3)
    got = answers(examples)
    from jaxrl_frontier.models.text import encode_prompts

    t, m = encode_prompts(tok, [task.prompt(e) for e in examples], 5)
    params = SamplingParams(greedy=True, n=1, max_new_tokens=3, eos_ids=(tok.eos_id,))
    ro = Sampler(model, pad_id=tok.pad_id).generate(t, m, params, jax.random.key(0))
    texts = decode(tok, np.asarray(ro.completion_tokens), np.asarray(ro.completion_mask))
    assert got == [texts[0].strip() or None, None]
