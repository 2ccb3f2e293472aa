"""run/rl_build.py: the RL stages' config checks, before anything is traced — the rollouts'
sampling settings, the objective against the fields a run provides, the sequence axis
against the rows it must split (the stages themselves run in tests/run/test_rl_step.py)."""

import pytest
from conftest import small_rl_config

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.tasks import task_for
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.run import rl_build
from jaxrl_frontier.run.config import sections


def _parts(c, **kw) -> rl_build.RunParts:
    tokenizer = CharTokenizer()
    task = task_for(sections.task_options(c), tokenizer)
    return rl_build.RunParts(
        mesh=None, tokenizer=tokenizer, task=task, policy=None, sampler=None, **kw
    )


def test_rollout_sampling_reads_the_rollout_section():
    c = small_rl_config()
    c.rollout.update(temperature=0.7, top_k=5, top_p=0.9, group_size=3, max_new_tokens=6)
    p = rl_build.rollout_sampling(c, CharTokenizer())
    assert (p.temperature, p.top_k, p.top_p, p.n, p.max_new_tokens) == (0.7, 5, 0.9, 3, 6)
    assert p.eos_ids == (CharTokenizer().eos_id,)  # the plain template stops at EOS alone
    c.rollout.ignore_eos = True  # every completion runs to max_new_tokens
    assert rl_build.rollout_sampling(c, CharTokenizer()).all_stop_ids == ()


def test_the_objective_is_checked_against_the_fields_the_run_provides():
    c = small_rl_config()
    c.objective.kl_coef = 0.1  # the KL to a reference reads ref_logp
    objective, editors, shapers, self_conditioned = rl_build.checked_objective(
        c, _parts(c, reference=True)
    )
    assert objective.kl_coef == 0.1 and not editors and not shapers and not self_conditioned
    with pytest.raises(ConfigError, match="ref_logp"):
        rl_build.checked_objective(c, _parts(c, reference=False))
    c.objective.kl_coef = 0.0
    c.train.collapse.stop, c.train.export = True, "last"
    with pytest.raises(ConfigError, match="'train.collapse.stop'.*train.export = 'best'"):
        rl_build.checked_objective(c, _parts(c))


def test_rows_the_sequence_axis_does_not_divide_are_a_config_error():
    c = small_rl_config(num_devices=0)
    c.mesh.sequence = 4
    mesh = sharding.make_mesh((1, 2, 4, 1))
    check = lambda tn, experts=0: rl_build.check_sequence_axis(  # noqa: E731
        c, completion_len=tn, mesh=mesh, experts=experts
    )
    check(4)  # rows of 16 * 2^j + 4 tokens: fine
    with pytest.raises(ConfigError, match=r"'mesh.sequence' = 4 must divide .* completion's 3"):
        check(3)
    c.train.pack_tokens = 18
    with pytest.raises(ConfigError, match=r"train.pack_tokens = 18; make it a multiple of 4"):
        check(4)
    c.train.pack_tokens = 20
    check(3)  # packed rows are 20 tokens whatever the completion
    c.train.pack_tokens = 0
    with pytest.raises(ConfigError, match=r"mixture-of-experts"):
        check(4, experts=4)
    with pytest.raises(ConfigError, match=r"'mesh.sequence' = 4 .* hybrid policy .* delta state"):
        rl_build.check_sequence_axis(c, completion_len=4, mesh=mesh, experts=0, linear=True)
    rl_build.check_sequence_axis(c, completion_len=3, mesh=sharding.make_mesh((1, 8, 1)), experts=4)
