"""A population's config (run/population/section.py): the keys it refuses, naming them and the
way out, and a grid's expansion into the members' values and configs."""

import pytest
from conftest import RL, small_rl_config, with_population

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run.population import section as population_config


def base_config():
    c = small_rl_config()
    for key, value in RL.items():
        section, name = key.split(".")
        c[section][name] = value
    c.objective.kl_coef = 0.05
    return c


def population_config_of(size=2, **vary):
    return with_population(base_config(), size, **vary)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda c: c.population.vary.objective.update(kl_coef=(0.1, 0.2, 0.3)), "has 3 values"),
        (lambda c: c.population.vary.objective.update(kl_coef=(0.0, 0.2)), "must be > 0"),
        (lambda c: c.rollout.update(max_staleness=2), "rollout.max_staleness"),
        (lambda c: c.schedules.objective.update(kl_coef="cosine(0.1, 0.01)"), "scheduled"),
        (lambda c: c.population.grid.rollout.update(temperature=(0.7, 1.0, 1.3)), "expands to 3"),
    ],
)
def test_refusals_name_the_key(change, words):
    c = population_config_of(objective__kl_coef=(0.1, 0.2))
    if "scheduled" in words:
        c.population.vary.objective.kl_coef = None
        c.population.vary.objective.kl_coef = (0.1, 0.2)
    change(c)
    with pytest.raises(ConfigError, match=words):
        population_config.member_values(c)


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda c: c.rollout.update(continuous_slots=4), "rollout.continuous_slots"),
        (lambda c: c.rollout.speculative.update(draft=1), "rollout.speculative.draft"),
    ],
)
def test_batched_sampling_refuses_the_other_samplers(change, key):
    c = population_config_of(objective__kl_coef=(0.1, 0.2))
    c.population.batched_sampling = True
    change(c)
    with pytest.raises(ConfigError, match=f"population.batched_sampling.*'{key}'"):
        population_config.member_values(c)
    c.population.batched_sampling = False  # the plain population samples with them
    assert len(population_config.member_values(c)) == 2


def loaded_lora(c):
    c.model.update(init="checkpoint", path="/runs/sft")
    c.model.lora.update(rank=4)
    return c


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda c: c.model.update(init="checkpoint", path="/runs/sft"), "model.lora.rank"),
        (lambda c: c.model.lora.update(rank=4), "model.init"),
        (lambda c: loaded_lora(c).rollout.update(continuous_slots=4), "rollout.continuous_slots"),
    ],
)
def test_a_lora_population_needs_adapters_on_a_loaded_base(change, key):
    """population.lora: adapters (model.lora.rank) on one base read from a file, sampled by
    the batched plain sampler; each missing part refused naming its key."""
    c = population_config_of(objective__kl_coef=(0.1, 0.2))
    c.population.lora = True
    change(c)
    with pytest.raises(ConfigError, match=f"'{key}'"):
        population_config.member_values(c)
    loaded_lora(c).rollout.update(continuous_slots=0)
    assert len(population_config.member_values(c)) == 2


def test_a_structural_key_is_refused_with_the_way_out():
    c = base_config()
    c.population.size = 2
    c.population.vary.unlock()
    c.population.vary.model = dict(hidden_size=(32, 64))
    with pytest.raises(ConfigError, match="model.hidden_size.*stages or separate runs"):
        population_config.member_values(c)


def test_a_grid_expands_to_its_product():
    c = base_config()
    c.population.grid.seed = (3, 4)
    c.population.grid.rollout.temperature = (0.7, 1.0)
    got = population_config.member_values(c)
    assert got == [
        {"seed": 3, "rollout.temperature": 0.7},
        {"seed": 3, "rollout.temperature": 1.0},
        {"seed": 4, "rollout.temperature": 0.7},
        {"seed": 4, "rollout.temperature": 1.0},
    ]
    member = population_config.member_config(c, got[3])
    assert member.seed == 4 and member.schedules.rollout.temperature == 1.0


def test_a_population_mesh_axis_is_refused_where_no_batched_update_splits_members(tmp_path):
    """mesh.population > 1 splits the members' batched update: without batched_update, with
    a size it does not divide, in a run with no population, or where it does not divide the
    devices, a one-line ConfigError names the key, its value and the way out."""
    from jaxrl_frontier.run import config as config_lib
    from jaxrl_frontier.run.population import driver as population

    c = population_config_of(objective__kl_coef=(0.1, 0.2))
    c.mesh.population = 2
    with pytest.raises(ConfigError) as e:
        population_config.member_values(c)
    assert str(e.value) == (
        "config key 'mesh.population' = 2 splits the members' batched update over devices: "
        "set population.batched_update = True, or mesh.population = 1"
    )
    c.population.batched_update = True
    assert len(population_config.member_values(c)) == 2  # accepted
    c.mesh.population = 4
    with pytest.raises(ConfigError, match=r"'mesh.population' = 4 must divide the population's 2"):
        population_config.member_values(c)
    solo = base_config()
    solo.mesh.population = 2
    with pytest.raises(ConfigError, match=r"'mesh.population' = 2 .* sets no population"):
        population.train(solo, str(tmp_path))
    solo.mesh.population = 3
    with pytest.raises(ConfigError, match=r"'mesh.population' = 3: must be >= 1 and divide"):
        config_lib.validate(solo, num_devices=8)
    solo.mesh.population = 0
    with pytest.raises(ConfigError, match=r"'mesh.population' = 0; allowed"):
        config_lib.validate(solo, num_devices=8)
