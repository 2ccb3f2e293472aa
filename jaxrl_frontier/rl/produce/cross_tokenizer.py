"""A teacher with another tokenizer than the student's (`teacher.tokenizer = 'own'`): the
sampled-token OPD objectives read `teacher_logp` per student token, so the student's
completion is re-tokenized by the teacher and each student token gets the teacher's
log-probability of its text (models/token_spans.py):

    prompt_t     = teacher.encode(student.decode(prompt))     (the prompt as the student saw
                                                               it, BOS of the teacher's own)
    completion_t = teacher.encode(student.decode(completion)) (+ the teacher's stop token
                                                               where the student stopped)
    logp_t       = the teacher's log-probs of completion_t after prompt_t   (one forward)
    teacher_logp[i] = sum of logp_t over the teacher tokens whose text ends in student
                      token i's; the student's stop token gets the teacher's stop token's

Rows are laid out [prompt_t left-padded to `prompt_len` | completion_t right-padded to
`teacher_budget`] (one compiled shape); a teacher completion longer than its budget is cut,
and the student tokens past the cut get 0 (`teacher.token_ratio` sets the budget). What this path cannot do: a full-vocabulary distillation loss (KL, JSD over the
teacher's distribution) needs one vocabulary, and is refused with this teacher.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.models import token_spans
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.produce.passes import PASSES, LogprobPass


def teacher_rows(student, teacher, tokens, attention, completion_len, prompt_len, budget):
    """The teacher's rows of a batch (module docstring): (tokens [B, prompt_len + budget],
    mask, per row (the student's completion positions, each teacher token's student token)).
    tokens, attention: the student's [B, T] host arrays, the completion the last
    `completion_len` positions."""
    b, t = tokens.shape
    p = t - completion_len
    out = np.full((b, prompt_len + budget), teacher.pad_id, np.int32)
    mask = np.zeros_like(out)
    maps = []
    for r in range(b):
        prompt = tokens[r, :p][attention[r, :p] > 0].tolist()
        where = np.flatnonzero(attention[r, p:] > 0)
        completion = tokens[r, p:][where].tolist()
        stopped = bool(completion) and completion[-1] == student.eos_id
        text = student.decode(completion, skip_special=True)
        prompt_ids, _ = teacher.batch_encode(
            [student.decode(prompt, skip_special=True)], max_len=prompt_len, truncate=True
        )
        prompt_ids = prompt_ids[0].tolist()
        own = teacher.encode(text) + ([teacher.eos_id] if stopped else [])
        owner = token_spans.owners(
            token_spans.ends(student, completion), token_spans.ends(teacher, own)
        )
        if stopped:  # the stop tokens write no text: the teacher's is the student's
            owner[-1] = len(completion) - 1
        own, owner = own[:budget], owner[:budget]
        out[r, prompt_len - len(prompt_ids) : prompt_len] = prompt_ids
        mask[r, prompt_len - len(prompt_ids) : prompt_len] = 1
        out[r, prompt_len : prompt_len + len(own)] = own
        mask[r, prompt_len : prompt_len + len(own)] = 1
        maps.append((p + where, owner))
    return out, mask, maps


@PASSES.register("cross_tokenizer_teacher")
def cross_tokenizer_teacher_pass(
    *, teacher_logp_fn, student_tokenizer, teacher_tokenizer, completion_len, prompt_len,
    teacher_budget, **_,
):  # fmt: skip
    """teacher_logp from a teacher with its own tokenizer (module docstring); teacher_logp_fn:
    its jitted log-prob forward over rows of `prompt_len + teacher_budget` tokens scoring the
    last `teacher_budget`. One process: the rows are decoded on the host."""

    def fn(params, exp: Experience):
        tokens, attention = (
            np.asarray(jax.device_get(x)) for x in (exp.tokens, exp.attention_mask)
        )
        rows, mask, maps = teacher_rows(
            student_tokenizer, teacher_tokenizer, tokens, attention, completion_len,
            prompt_len, teacher_budget,
        )  # fmt: skip
        logp_t = np.asarray(teacher_logp_fn(params, jnp.asarray(rows), jnp.asarray(mask)))
        out = np.zeros(tokens.shape, np.float32)
        for r, (positions, owner) in enumerate(maps):
            scored = logp_t[r, prompt_len : prompt_len + len(owner)]
            out[r, positions] = token_spans.to_student_tokens(scored, owner, len(positions))
        return jax.device_put(out, exp.tokens.sharding)

    return LogprobPass("teacher_logp", "teacher", fn)
