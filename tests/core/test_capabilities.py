"""core/capabilities.py: a part's declaration names the features it lacks, each with why;
every other known feature it supports, and a feature outside FEATURES is a ValueError."""

import dataclasses

import pytest

from jaxrl_frontier.core.capabilities import ALL, FEATURES, Capabilities


def test_all_but_lists_the_lacks_sorted_and_answers_per_feature():
    caps = Capabilities.all_but(stages="it fixes its keys", multi_process="one host only")
    assert caps.lacks == (("multi_process", "one host only"), ("stages", "it fixes its keys"))
    assert caps == Capabilities.all_but(multi_process="one host only", stages="it fixes its keys")
    assert [f for f in FEATURES if not caps.supports(f)] == ["multi_process", "stages"]
    assert caps.why_not("stages") == "it fixes its keys" and caps.why_not("partial_rows") == ""
    assert all(ALL.supports(f) and ALL.why_not(f) == "" for f in FEATURES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.lacks = ()


def test_unknown_features_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown features \['typo'\]; known: partial_rows, "):
        Capabilities.all_but(typo="x", stages="y")
    with pytest.raises(ValueError, match=r"unknown feature 'typo'; known: partial_rows, "):
        ALL.supports("typo")
