"""The run's roles (run/roles.py): what a population's member takes from the first member's
roles (`Roles.sharing`): the samplers always; the frozen weights that do not depend on the
seed (a policy or teacher from a file) when both hold them; its own trained policy never."""

import types

import pytest

from jaxrl_frontier.run.config import base_config, resolve
from jaxrl_frontier.run.roles import Roles


def _roles(tag, *, base=True, ref=True, teacher=True):
    """Roles whose every field is a distinct marker naming `tag` (None where absent)."""
    mark = lambda name: f"{tag}.{name}"  # noqa: E731
    return Roles(
        mesh=mark("mesh"),
        rollout_mesh=mark("rollout_mesh"),
        tokenizer=mark("tokenizer"),
        policy=mark("policy"),
        graphdef=mark("graphdef"),
        base_params=mark("base") if base else None,
        ref_params=mark("ref") if ref else None,
        teacher=mark("teacher") if teacher else None,
        teacher_params=mark("teacher_params") if teacher else None,
        sampler=mark("sampler"),
        rollout_sampler=mark("rollout_sampler"),
        reward_model=mark("reward_model"),
        judge=mark("judge"),
        tagged_teachers=mark("tagged_teachers") if teacher else (),
        teacher_tags={},
        teacher_tokenizer=mark("teacher_tokenizer") if teacher else None,
    )


def _config(model="scratch", teacher="none"):
    c = resolve(base_config())
    c.model.init, c.teacher.init = model, teacher
    return c


OWN = ("mesh", "rollout_mesh", "tokenizer", "policy", "graphdef")
# a teacher from a file, shared with what comes with it (several teachers, its tokenizer)
TEACHER = ("teacher", "teacher_params", "tagged_teachers", "teacher_tokenizer")


def _source(roles):
    """{field: the tag of the roles it came from}."""
    return {k: v.split(".")[0] for k, v in vars(roles).items() if isinstance(v, str)}


@pytest.mark.parametrize(
    "model, teacher, shared",
    [
        ("scratch", "none", {"sampler", "rollout_sampler"}),
        ("scratch", "scratch", {"sampler", "rollout_sampler"}),
        ("scratch", "checkpoint", {"sampler", "rollout_sampler", *TEACHER}),
        ("checkpoint", "none", {"sampler", "rollout_sampler", "base_params", "ref_params"}),
    ],
)
def test_a_member_shares_the_samplers_and_the_weights_from_files(model, teacher, shared):
    held = teacher != "none"
    mine, first = _roles("mine", teacher=held), _roles("first", teacher=held)
    got = _source(mine.sharing(first, _config(model, teacher)))
    assert {k for k, tag in got.items() if tag == "first"} == shared
    assert all(got[k] == "mine" for k in OWN)
    assert mine.sampler == "mine.sampler"  # a copy: the member's own roles are untouched


def test_frozen_weights_are_shared_only_where_both_hold_them():
    c = _config("hf")
    # no LoRA base on the member (another rank 0 config): neither base nor reference shared
    got = _source(_roles("mine", base=False).sharing(_roles("first"), c))
    assert "base_params" not in got and got["ref_params"] == "mine"
    # both hold a base, only the member a reference: the base is shared, its reference kept
    got = _source(_roles("mine").sharing(_roles("first", ref=False), c))
    assert (got["base_params"], got["ref_params"]) == ("first", "mine")
    # neither holds a reference: the base shared, the reference None on both
    roles = _roles("mine", ref=False).sharing(_roles("first", ref=False), c)
    assert (roles.base_params, roles.ref_params) == ("first.base", None)


def test_a_reward_model_and_a_judge_from_files_are_shared():
    c = _config()
    got = _source(_roles("mine").sharing(_roles("first"), c))
    assert (got["reward_model"], got["judge"]) == ("mine", "mine")  # none configured: own
    c.reward_model.init, c.judge.init = "hf", "hf"
    got = _source(_roles("mine").sharing(_roles("first"), c))
    assert (got["reward_model"], got["judge"]) == ("first", "first")


def test_a_teacher_from_a_file_replaces_an_absent_one():
    c = _config("scratch", "hf")
    roles = _roles("mine", teacher=False).sharing(_roles("first"), c)
    assert (roles.teacher, roles.teacher_params) == ("first.teacher", "first.teacher_params")
    assert isinstance(roles, Roles) and not isinstance(roles, types.SimpleNamespace)
