import pytest

from jaxrl_frontier.core.capabilities import ALL
from jaxrl_frontier.core.errors import UnknownNameError
from jaxrl_frontier.core.registry import Registry


def test_register_get_names_and_doc():
    reg = Registry("widget")

    @reg.register("b")
    def b():
        """formula b"""
        return 2

    @reg.register("a")
    def a():
        return 1

    assert reg.get("a") is a and reg.get("b")() == 2
    assert reg.names() == ["a", "b"]
    assert reg.doc("b") == "formula b"
    assert "a" in reg and "z" not in reg and len(reg) == 2


def test_unknown_name_lists_known_names():
    reg = Registry("widget")
    reg.register("ppo_clip")(lambda: None)
    reg.register("pg")(lambda: None)
    with pytest.raises(
        KeyError, match=r"unknown widget 'ppo_clp'.*pg, ppo_clip.*Did you mean 'ppo_clip'"
    ):
        reg.get("ppo_clp")


def test_duplicate_name_is_an_error():
    reg = Registry("widget")
    reg.register("x")(lambda: None)
    with pytest.raises(ValueError, match="duplicate name 'x'"):
        reg.register("x")(lambda: None)


def test_unregister_takes_an_entry_back():
    class Part:
        capabilities = "declared"

    reg = Registry("widget")
    reg.register("x", part=Part)(lambda: 1)
    assert reg.capabilities("x") == "declared"
    reg.unregister("x")
    assert "x" not in reg and len(reg) == 0
    reg.unregister("x")  # absent: nothing happens
    reg.register("x")(lambda: 2)  # the name is free again, its old part gone with it
    assert reg.get("x")() == 2 and reg.capabilities("x") is ALL


def test_part_is_the_declared_class_or_the_default():
    class Base:
        changes_tokens = False

    class Editor(Base):
        changes_tokens = True

    reg = Registry("editor", key="rollout.editors", default_part=Base)
    reg.register("dre", part=Editor)(lambda: None)
    reg.register("plain")(lambda: None)
    assert reg.part("dre") is Editor and reg.part("plain") is Base
    bare = Registry("widget")
    bare.register("w")(len)
    assert bare.part("w") is None
    with pytest.raises(UnknownNameError, match="config key 'rollout.editors'"):
        reg.part("drE")
