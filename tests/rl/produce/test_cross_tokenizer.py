"""The teacher with its own tokenizer (rl/produce/cross_tokenizer.py): with the student's own
tokenizer the re-tokenized path gives the plain teacher pass's log-probs (the same tokens,
one teacher token per student token), stop token included; with a coarser tokenizer each
student token gets the log-probs of the teacher tokens that end in it."""

import jax.numpy as jnp
import numpy as np
from conftest import SMALL_MODEL, random_model
from flax import nnx

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.learn.forward import make_logp_fn
from jaxrl_frontier.rl.produce import cross_tokenizer
from jaxrl_frontier.rl.produce.passes import PASSES, run_passes

CHARS = CharTokenizer()
P, TN = 7, 5


def _batch():
    """Two rows [prompt | completion]: left-padded prompts, completions of 5 and 3 tokens
    (the second stopped by EOS, then padding)."""
    rows = [("1+2=", "3 ok."), ("12+30=", "42")]
    tokens = np.full((2, P + TN), CHARS.pad_id, np.int32)
    attention = np.zeros_like(tokens)
    for r, (prompt, completion) in enumerate(rows):
        p = [CHARS.bos_id, *CHARS.encode(prompt)]
        c = CHARS.encode(completion) + ([CHARS.eos_id] if r == 1 else [])
        tokens[r, P - len(p) : P], tokens[r, P : P + len(c)] = p, c
        attention[r, P - len(p) : P], attention[r, P : P + len(c)] = 1, 1
    loss_mask = attention * (np.arange(P + TN) >= P)
    b, t = tokens.shape
    zeros = jnp.zeros((b, t), jnp.float32)
    return Experience(
        tokens=jnp.asarray(tokens), attention_mask=jnp.asarray(attention),
        loss_mask=jnp.asarray(loss_mask, jnp.float32), old_logp=zeros, advantages=zeros,
        rewards=jnp.zeros((b, 1)), prompt_index=jnp.zeros((b,), jnp.int32),
        group_id=jnp.zeros((b,), jnp.int32), policy_version=jnp.zeros((b,), jnp.int32),
        turn_index=jnp.zeros((b, t), jnp.int32),
    )  # fmt: skip


def test_with_the_students_tokenizer_the_plain_pass():
    teacher = random_model(ModelConfig(vocab_size=CHARS.vocab_size, **SMALL_MODEL), seed=3)
    graphdef, params = nnx.split(teacher)
    exp = _batch()
    plain = PASSES.get("teacher")(teacher_logp_fn=make_logp_fn(graphdef, completion_len=TN))
    cross = PASSES.get("cross_tokenizer_teacher")(
        teacher_logp_fn=make_logp_fn(graphdef, completion_len=2 * TN),
        student_tokenizer=CHARS, teacher_tokenizer=CHARS, completion_len=TN,
        prompt_len=P + 2, teacher_budget=2 * TN,
    )  # fmt: skip
    want, _ = run_passes([plain], {"teacher": params}, exp)
    got, _ = run_passes([cross], {"teacher": params}, exp)
    assert np.abs(np.asarray(want.teacher_logp)).sum() > 0
    # the same tokens at other padding: f32 sums of another length
    np.testing.assert_allclose(got.teacher_logp, want.teacher_logp, rtol=1e-5, atol=1e-5)


class Pairs(CharTokenizer):
    """A coarser tokenizer over the same characters: each pair of characters is one token
    (the pair's id: 1000 + first * 100 + second), a lone last character its own."""

    def encode(self, text, errors="strict"):
        ids = super().encode(text, errors)
        pairs = [1000 + ids[i] * 100 + ids[i + 1] for i in range(0, len(ids) - 1, 2)]
        return pairs + ([ids[-1]] if len(ids) % 2 else [])

    def _decode_ids(self, ids, skip_special):
        flat = []
        for i in ids:
            flat += [(i - 1000) // 100, (i - 1000) % 100] if i >= 1000 else [i]
        return super()._decode_ids(flat, skip_special)


def test_a_coarser_teachers_tokens_land_where_they_end():
    exp = _batch()
    pairs = Pairs()
    rows, mask, maps = cross_tokenizer.teacher_rows(
        CHARS, pairs, np.asarray(exp.tokens), np.asarray(exp.attention_mask), TN, P + 2, 2 * TN
    )
    # row 0, completion "3 ok." (5 chars): teacher tokens "3 ", "ok", "." end in student
    # tokens 1, 3 and 4; row 1, "42" then EOS: "42" ends in token 1, the teacher's EOS is
    # the student's (token 2)
    assert maps[0][1].tolist() == [1, 3, 4] and maps[1][1].tolist() == [1, 2]
    assert rows[1, P + 2 + 1] == pairs.eos_id and mask[1].sum() == len(pairs.encode("12+30=")) + 3
