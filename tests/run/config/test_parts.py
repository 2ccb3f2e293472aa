"""A run's parts declare what they support (core/capabilities.py); run/config/parts.py checks
a run's needs against them once, naming each key whose part falls short.

- each part's class is found from the config alone (registry lookups, nothing built);
- the refusals of today's modes come from those declarations, one error naming every key;
- a toy mode is one `MODES` row, its feature, and one declaration on each part that lacks it:
  no refusal list to edit, and the error names exactly the parts that declared it.
"""

import dataclasses

import pytest

from jaxrl_frontier.core import capabilities as caps_lib
from jaxrl_frontier.core.capabilities import ALL, Capabilities
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.rl.ahead import FreeRunningRollouts, RolloutsAhead
from jaxrl_frontier.rl.methods.pact import PactProducer
from jaxrl_frontier.rl.produce.agent import AgentRolloutProducer
from jaxrl_frontier.rl.produce.editors import EDITORS, DynamicRolloutEditing, RolloutEditor
from jaxrl_frontier.rl.produce.producer import RolloutProducer
from jaxrl_frontier.rl.sources import SOURCES, PromptSource, UniformSource
from jaxrl_frontier.rl.sources.dynamic import DynamicSource
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.config import parts
from jaxrl_frontier.sampling.partial import PartialSampler
from jaxrl_frontier.sampling.sampler import Sampler


def _config(**rollout):
    c = config_lib.resolve(config_lib.base_config())
    c.rollout.update(**rollout)
    return c


def test_parts_come_from_the_config_by_lookup():
    c = _config(continuous_slots=4, partial_budget=2, editors=("dre",))
    c.data.source = "dynamic"
    got = {p.key: p.capabilities for p in parts.parts_of(c)}
    assert got == {
        "rollout.continuous_slots = 4": PartialSampler.capabilities,
        "env.name = ''": RolloutProducer.capabilities,
        "data.source = 'dynamic'": DynamicSource.capabilities,
        "rollout.editors with 'dre'": DynamicRolloutEditing.capabilities,
    }
    c = _config(max_staleness=1, free_running_queue=2)
    c.env.name, c.pact.enabled = "gridworld", True
    got = {p.key: p.capabilities for p in parts.parts_of(c)}
    assert got["rollout.free_running_queue = 2"] == FreeRunningRollouts.capabilities
    assert got["env.name = 'gridworld'"] == AgentRolloutProducer.capabilities
    assert got["pact.enabled"] == PactProducer.capabilities
    assert got["rollout.continuous_slots = 0"] == Sampler.capabilities
    assert parts.parts_of(_config(max_staleness=1))[1].capabilities == RolloutsAhead.capabilities


def test_one_error_names_every_key_of_every_need():
    c = _config(partial_budget=2, max_staleness=1, free_running_queue=2)
    c.data.source = "dynamic"
    with pytest.raises(ConfigError) as e:
        parts.check_capabilities(c, procs=2)
    msg = str(e.value)
    for words in (
        "'rollout.partial_budget' = 2 (partial rollouts) does not go with: "
        "rollout.continuous_slots = 0 (the rows start in its idle slots); "
        "rollout.free_running_queue = 2 (batches produced ahead whole); "
        "data.source = 'dynamic' (it draws more prompts within a step)",
        "'rollout.free_running_queue' = 2 does not go with: data.source = 'dynamic' (it reads "
        "the results as it draws); 2 processes (their collectives would follow its timing)",
        "several processes samples each process's rows in a background thread that must not "
        "talk to other processes; not with: data.source = 'dynamic' (its draws agree across hosts)",
    ):
        assert words in msg, msg
    assert msg.count("\n") == 2  # three subjects, one error
    parts.check_capabilities(_config(max_staleness=2), procs=2)  # the plain run passes
    # what the loop asks of them: batches in flight saved with a checkpoint
    assert parts.supports(_config(max_staleness=2), "keeps_rows_in_flight")
    c.rollout.update(partial_budget=0, free_running_queue=0)
    assert not parts.supports(c, "keeps_rows_in_flight")  # dynamic draws within a step


@SOURCES.register("test_parts_user_source")  # a user's source, registered without its class
def _user_source(task, options, *, batch_size, process_index, process_count):
    raise NotImplementedError


def test_a_source_registered_without_its_class_has_the_base_declaration():
    assert SOURCES.capabilities("test_parts_user_source") == PromptSource.capabilities
    assert SOURCES.capabilities("uniform") == UniformSource.capabilities == ALL
    assert EDITORS.capabilities("mask_truncated") == RolloutEditor.capabilities
    with pytest.raises(ConfigError, match="data.source"):
        SOURCES.capabilities("nope")


def test_a_toy_mode_is_one_declaration_per_part(monkeypatch):
    """`rollout.top_k > 0` made a toy mode needing `sees_logits`: its feature, one MODES row,
    and one declaration on the two parts that lack it (the dynamic source, DRE); nothing
    else changes, and the error names exactly those two keys."""
    monkeypatch.setitem(caps_lib.FEATURES, "sees_logits", "a toy mode (rollout.top_k > 0)")
    toy = parts.Mode(
        "sees_logits",
        lambda c, procs: (
            parts.Need("sees_logits", f"'rollout.top_k' = {c.rollout.top_k}")
            if c.rollout.top_k
            else None
        ),
    )
    monkeypatch.setattr(parts, "MODES", [*parts.MODES, toy])
    for cls, why in ((DynamicSource, "it filters"), (DynamicRolloutEditing, "it edits")):
        lacks = dict(cls.capabilities.lacks) | {"sees_logits": why}
        monkeypatch.setattr(cls, "capabilities", Capabilities.all_but(**lacks))

    c = _config(top_k=5, editors=("dre", "mask_truncated"))
    c.data.source = "dynamic"
    with pytest.raises(ConfigError) as e:
        parts.check_capabilities(c, procs=1)
    assert str(e.value) == (
        "config key 'rollout.top_k' = 5 does not go with: data.source = 'dynamic' (it filters); "
        "rollout.editors with 'dre' (it edits)"
    )
    c.data.source, c.rollout.editors = "uniform", ("mask_truncated",)
    parts.check_capabilities(c, procs=1)  # parts that did not declare it support it
    c.rollout.top_k = 0
    c.data.source = "dynamic"
    parts.check_capabilities(c, procs=1)  # the mode is off: nothing asked
    with pytest.raises(ValueError, match="unknown features"):
        Capabilities.all_but(sees_everything="typo")


def test_declarations_are_frozen_data():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DynamicSource.capabilities.lacks = ()
    assert not DynamicSource.capabilities.supports("partial_rows")
    assert DynamicSource.capabilities.why_not("process_local") == "its draws agree across hosts"
    assert UniformSource.capabilities.why_not("partial_rows") == ""


def test_an_environment_run_refuses_the_parts_that_lack_episodes():
    """One error naming each part that declares it serves no episodes (a speculative
    sampler, an editor, a task-prompt source) and Dropout-GRPO's masks; the plain run and
    3SPO's source pass."""
    c = _config(dropout_rate=0.1, editors=("dre",))
    c.rollout.speculative.draft = 1
    c.env.name, c.data.source = "gridworld", "dynamic"
    with pytest.raises(ConfigError) as e:
        parts.check_capabilities(c, procs=1, only=("environment",))
    assert str(e.value) == (
        "config key 'env.name' = 'gridworld' does not go with: rollout.dropout_rate = 0.1 "
        "(per-row MLP masks of one turn); rollout.speculative.draft = 1 (an environment's turns "
        "are sampled by the plain sampler); data.source = 'dynamic' (it draws task prompts, "
        "not an environment's episodes); rollout.editors with 'dre' (it edits single-turn "
        "completions)"
    )
    c = _config()
    c.env.name = "gridworld"
    for source in ("uniform", "sspo"):
        c.data.source = source
        parts.check_capabilities(c, procs=1, only=("environment",))


def test_a_population_refuses_the_parts_that_lack_it():
    c = _config(max_staleness=1)
    c.population.size, c.env.name, c.mode = 2, "gridworld", "sft"
    with pytest.raises(ConfigError) as e:
        parts.check_capabilities(c, procs=1, only=("population",))
    msg = str(e.value)
    assert msg.startswith("config keys in a population: mode = 'sft' (a population trains RL")
    for words in (
        "rollout.max_staleness > 0 (members step in turn, without rollouts produced ahead",
        "env.name = 'gridworld' (environment runs are not run as a population yet)",
    ):
        assert words in msg, msg
    c = _config(continuous_slots=2, partial_budget=1)
    c.population.size = 2
    with pytest.raises(ConfigError, match="partial rollouts hold rows in the shared sampler"):
        parts.check_capabilities(c, procs=1, only=("population",))
    parts.check_capabilities(_config(continuous_slots=2), procs=1)  # no population: no need


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(share_prompt=True), "share_prompt_forward = False"),
        (dict(dropout_rate=0.1), "dropout_rate"),
        (dict(critic="head"), "critic"),
        (dict(pact=True), "pact"),
    ],
)
def test_packed_rows_refuse_what_runs_on_padded_rows(change, match):
    c = _config(dropout_rate=change.get("dropout_rate", 0.0))
    c.train.update(pack_tokens=16, share_prompt_forward=change.get("share_prompt", False))
    c.critic.kind, c.pact.enabled = change.get("critic", "none"), change.get("pact", False)
    assert parts.refusals(_config(), procs=1) == []
    with pytest.raises(ConfigError, match=match) as e:
        parts.check_capabilities(c, procs=1)
    text = str(e.value)
    assert text.startswith("config key 'train.pack_tokens' = 16 does not run with ")
    assert text.endswith("; set train.pack_tokens = 0") and "\n" not in text
    c.mode = "sft"  # packed rows are RL's: an SFT run asks nothing of them
    assert parts.refusals(c, procs=1) == []


def test_packed_rows_name_every_refused_key_in_one_line():
    c = _config(dropout_rate=0.1)
    c.train.pack_tokens, c.critic.kind = 16, "model"  # share_prompt_forward: on by default
    assert parts.refusals(c, procs=1) == [
        "config key 'train.pack_tokens' = 16 does not run with train.share_prompt_forward = "
        "True (a group's prompt once; packing removes the padding instead: set "
        "train.share_prompt_forward = False); rollout.dropout_rate > 0 (per-row MLP masks); "
        "critic.kind = 'model' (its values on the padded rows); set train.pack_tokens = 0"
    ]


def test_the_sequence_axis_refuses_a_mixture_of_experts():
    c = _config()
    c.mesh.sequence, c.model.moe.num_experts = 2, 4
    assert parts.refusals(c, procs=1) == [
        "config key 'mesh.sequence' = 2 does not go with: model.moe.num_experts = 4 (the "
        "expert-parallel dispatch takes whole rows)"
    ]
    c.model.moe.num_experts = 0
    assert parts.refusals(c, procs=1) == []
