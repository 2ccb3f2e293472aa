"""The `config.objective` section (objectives/schema.py): unknown names and keys named with
the allowed ones, the inputs each term needs, and the traced keys a schedule moves, read and
replaced on hand-written sections."""

import pytest

from jaxrl_frontier.core.errors import ObjectiveConfigError
from jaxrl_frontier.objectives import schema
from jaxrl_frontier.objectives.schema import default_config, validate_objective_config


def test_unknown_names_list_the_known_ones():
    with pytest.raises(KeyError, match=r"config key 'objective.weight'.*'ppo_clipp'.*ppo_clip"):
        validate_objective_config({"weight": "ppo_clipp"})
    with pytest.raises(KeyError, match=r"aggregation.*'mean'.*token_mean"):
        validate_objective_config({"aggregation": "mean"})
    with pytest.raises(KeyError, match=r"distill.*'kl'.*forward_kl"):
        validate_objective_config({"distill": "kl"})
    with pytest.raises(KeyError, match=r"kl_estimator.*'k4'.*k3"):
        validate_objective_config({"kl_estimator": "k4"})
    with pytest.raises(KeyError, match=r"advantage.*'grpoo'"):
        validate_objective_config({"advantage": "grpoo"})


def test_unknown_keys_are_named_with_the_allowed_ones():
    with pytest.raises(ObjectiveConfigError, match=r"'eps'.*'ppo_clip'.*eps_low, eps_high"):
        validate_objective_config({"weight": "ppo_clip", "weight_kwargs": {"eps": 0.2}})
    with pytest.raises(ObjectiveConfigError, match=r"'beta'.*'forward_kl'.*top_k"):
        validate_objective_config({"distill": "forward_kl", "distill_kwargs": {"beta": 0.5}})
    with pytest.raises(ObjectiveConfigError, match=r"'C'.*max_completion_len"):
        validate_objective_config(
            {"aggregation": "seq_mean_token_sum_norm", "aggregation_kwargs": {"C": 4}}
        )
    with pytest.raises(ObjectiveConfigError, match=r"unknown key 'kl_coeff'.*kl_coef"):
        validate_objective_config({"kl_coeff": 0.1})
    cfg = default_config()
    cfg.weight_kwargs.eps_hi = 0.28
    cfg.weight = "ppo_clip"
    with pytest.raises(ObjectiveConfigError, match="eps_hi"):
        validate_objective_config(cfg)


def test_required_fields_name_who_needs_each_input():
    need = schema.required_fields({"weight": "iw_opd", "kl_coef": 0.1, "distill": "reverse_kl"})
    assert need["kl_coef > 0"] == ("ref_logp",)
    assert need["distill 'reverse_kl'"] == ("teacher_logits",)
    assert "teacher_logp" in need["weight 'iw_opd'"]
    # the KL folded into the reward needs no reference log-probs in the loss; no distill, none
    need = schema.required_fields({"kl_coef": 0.1, "kl_in_reward": True})
    assert set(need) == {"weight 'ppo_clip'"}


def test_traced_keys_read_and_replace_the_configured_values():
    keys = schema.traced_keys()
    assert keys[: len(schema.TRACED_KEYS)] == schema.TRACED_KEYS
    assert {"weight_kwargs.eps_low", "weight_kwargs.eps_high"} <= set(keys)
    cfg = {"weight": "ppo_clip", "weight_kwargs": {"eps_high": 0.28}, "kl_coef": 0.05}
    assert schema.value_of(cfg, "kl_coef") == 0.05
    assert schema.value_of(cfg, "entropy_coef") == 0.0  # DEFAULTS
    assert schema.value_of(cfg, "weight_kwargs.eps_high") == 0.28  # configured
    assert schema.value_of(cfg, "weight_kwargs.eps_low") == 0.2  # ppo_clip's own default
    out = schema.with_values(cfg, {"kl_coef": 0.5, "weight_kwargs.eps_low": 0.1})
    assert out.kl_coef == 0.5 and out.weight_kwargs == {"eps_high": 0.28, "eps_low": 0.1}
    assert cfg["kl_coef"] == 0.05 and cfg["weight_kwargs"] == {"eps_high": 0.28}  # a copy
    # a term is on when its coefficient is non-zero; None in a kwargs block = the default
    assert schema.term_on(out, "kl_coef") and not schema.term_on(out, "entropy_coef")
    assert schema.setting({"distill_kwargs": {"top_k": None}}, "distill_kwargs") == {}


def test_the_objective_is_a_typed_hashable_record():
    given = {"weight": "ppo_clip", "weight_kwargs": {"eps_high": 0.28, "eps_low": None}}
    objective = schema.objective_of(given)
    assert isinstance(objective, schema.ObjectiveSection)
    assert objective.weight_kwargs == {"eps_high": 0.28}  # an unset placeholder: the default
    assert objective.kl_coef == schema.DEFAULTS["kl_coef"] and objective.distill is None
    assert schema.objective_of(objective) is objective
    # equal settings, equal records and hashes (a static argument of a jitted function)
    same = schema.objective_of({"weight_kwargs": {"eps_high": 0.28}})
    assert same == objective and hash(same) == hash(objective)
    assert hash(schema.with_values(objective, {"kl_coef": 0.5})) != hash(objective)
    with pytest.raises(ObjectiveConfigError, match=r"unknown key 'kl_coeff'.*kl_coef"):
        schema.objective_of({"kl_coeff": 0.1})
