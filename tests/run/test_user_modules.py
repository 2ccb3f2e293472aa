"""The config's `modules` key: a user's own module registers an advantage
(`register_advantage`) and a weight (`register_weight`), each in one declaration, and the
config then names them like built-in entries: their defaults fill the kwargs blocks, the
credit and the loss compute them, a run trains with them, a typo gets the close match."""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FAST, REPO, get_config, read_metrics

from jaxrl_frontier.core.errors import ConfigError, UnknownNameError
from jaxrl_frontier.objectives import ADVANTAGES, WEIGHTS, TokenStats, objective_loss
from jaxrl_frontier.rl import credit
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.build import objective_section

USER_MODULE = '''
import jax.numpy as jnp
from jaxrl_frontier.objectives import register_advantage, register_weight

@register_advantage("user_minus_best", "group")
def minus_best(rewards, margin: float = 0.0):
    """A_i = r_i - max_j r_j + margin, per group."""
    return rewards - jnp.max(rewards, axis=1, keepdims=True) + margin

@register_advantage("user_scored", "token", requires=("ref_logp",), test_time_only="a score")
def scored(stats, beta: float = 1.0):
    """a_t = beta (l_old - l_ref): declared test-time only."""
    return beta * (stats.old_logp - stats.ref_logp) * stats.mask

@register_advantage("user_valued", "group", critic=True)
def valued(rewards):
    """A = R, replaced by the learner from a critic's values: declared to need a critic."""
    return rewards

@register_weight("user_scaled_pg")
def scaled_pg(stats, adv, scale: float = 0.5):
    """w = scale: the plain policy gradient, scaled."""
    return jnp.full_like(stats.logp, scale)
'''


@pytest.fixture
def user_module(tmp_path):
    path = tmp_path / "my_objectives.py"
    path.write_text(USER_MODULE)
    yield str(path)
    # the registries and sys.modules as they were: another test may register the same names
    for name in ("user_minus_best", "user_scored", "user_valued"):
        ADVANTAGES.unregister(name)
    WEIGHTS.unregister("user_scaled_pg")
    for name in [n for n in sys.modules if n.startswith("jaxrl_user_") and "my_objectives" in n]:
        del sys.modules[name]


def user_config(path: str, **objective):
    c = get_config("grpo_arith", FAST)
    c.modules = path
    c.objective.advantage = "user_minus_best"
    c.objective.weight = "user_scaled_pg"
    c.objective.update(objective)
    return config_lib.resolve(c)


def test_entries_from_a_user_module_resolve_with_their_defaults(user_module):
    c = user_config(user_module)
    config_lib.validate(c)
    assert c.objective.advantage_kwargs.to_dict() == {"margin": 0.0}
    assert c.objective.weight_kwargs.to_dict() == {"scale": 0.5}
    with pytest.raises(UnknownNameError, match="Did you mean 'user_scaled_pg'"):
        user_config(user_module, weight="user_scaled_gp")
    c.objective.advantage_kwargs.marign = 1.0
    with pytest.raises(ConfigError, match="marign"):
        config_lib.validate(c)


def test_a_missing_module_is_a_config_error_naming_the_key(tmp_path):
    c = get_config("grpo_arith", FAST)
    c.modules = str(tmp_path / "absent.py")
    with pytest.raises(ConfigError, match="config key 'modules'.*absent.py"):
        config_lib.resolve(c)
    c.modules = "no_such_package_xyz.objectives"
    with pytest.raises(ConfigError, match="config key 'modules'.*no_such_package_xyz"):
        config_lib.resolve(c)


def test_credit_and_loss_compute_the_user_entries(user_module):
    c = user_config(user_module, advantage_kwargs={"margin": 0.25})
    objective = objective_section(c.objective)  # as the run reads it
    # one prompt, four completions: correctness [1, 0, 1, 0], max 1, so A = r - 1 + 0.25
    rewards = jnp.asarray([[[1.0], [0.0], [1.0], [0.0]]])
    mask = jnp.asarray([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], jnp.float32)
    logp = jnp.log(jnp.asarray([[0.5, 0.5, 1], [0.2, 1, 1], [0.9, 0.3, 0.6], [0.4, 0.8, 1]]))
    stats = TokenStats(logp=logp * mask, old_logp=logp * mask, mask=mask)
    adv, _ = credit.compute_advantages(objective, rewards, ("correctness",), stats)
    want = np.array([0.25, -0.75, 0.25, -0.75])[:, None] * np.asarray(mask)
    np.testing.assert_allclose(np.asarray(adv), want, rtol=1e-6)

    def grad_of(weight):  # d loss / d logp: -m w A / Z, w = 1 for pg at the behaviour policy
        kwargs = {"scale": 0.5} if weight == "user_scaled_pg" else {}
        cfg = dataclasses.replace(objective, weight=weight, weight_kwargs=kwargs)
        loss = lambda lp: objective_loss(stats.replace(logp=lp), adv, cfg)[0]
        return np.asarray(jax.grad(loss)(stats.logp))

    np.testing.assert_allclose(grad_of("user_scaled_pg"), 0.5 * grad_of("pg"), rtol=1e-6)
    assert np.abs(grad_of("pg")).sum() > 0


def test_a_run_trains_with_the_user_entries(user_module, tmp_path):
    from jaxrl_frontier.run.trainer import Trainer

    # margin > 0: the best row of a group still has A > 0, so the update moves
    c = user_config(user_module, advantage_kwargs={"margin": 0.25})
    c.train.steps = 2
    Trainer(c, str(tmp_path / "run")).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "train/loss" in r]
    assert len(rows) == 2
    for r in rows:  # the user's weight is the constant 0.5 on every valid token
        assert r["train/weight_mean"] == pytest.approx(0.5, rel=1e-6)
        assert np.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0


def test_the_command_line_sets_the_user_entries_knobs(user_module):
    """--config.modules is imported before the config file loads, so the file's kwargs blocks
    hold the user's knobs and a flag can set one (ml-collections adds no key a file lacks)."""
    from jaxrl_frontier.run.config import flags as cli

    argv = ["train.py", f"--config={REPO}/configs/grpo_arith.py", "--workdir=unused",
            f"--config.modules={user_module}", "--config.objective.advantage=user_minus_best",
            "--config.objective.advantage_kwargs.margin=0.1"]  # fmt: skip
    c, _ = cli.parse(argv)
    c = config_lib.resolve(c)
    assert c.objective.advantage_kwargs.to_dict() == {"margin": 0.1}


def test_what_an_advantage_declares_it_needs_is_checked(user_module):
    """A test-time-only entry is refused for training with its own reason; an entry that
    reads a critic's values needs critic.kind, and a critic needs such an entry."""
    with pytest.raises(ConfigError, match="'user_scored' cannot train a policy: a score"):
        config_lib.validate(user_config(user_module, advantage="user_scored"))
    c = user_config(user_module, advantage="user_valued")
    with pytest.raises(ConfigError, match="'critic.kind' = 'none'.*'user_valued' reads? "):
        config_lib.validate(c)
    c = user_config(user_module, advantage="user_minus_best")
    c.critic.kind = "head"
    with pytest.raises(ConfigError, match="'gae' or 'user_valued' goes with critic.kind"):
        config_lib.validate(c)
