"""Checkpointer: (state pytree, JSON metadata) round trips, retention, sharded restore; copying
one step directory into another run (copy_step, what a campaign seeds a segment with)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import CheckpointError
from jaxrl_frontier.train.checkpoint import Checkpointer, abstract_like, copy_step, step_dirs


def _state(seed: int):
    k = jax.random.key(seed)
    return dict(
        params=dict(w=jax.random.normal(k, (8, 4)), b=jnp.arange(4, dtype=jnp.float32) + seed),
        step=jnp.asarray(seed, jnp.int32),
        rng=jax.random.key_data(k),
    )


def test_round_trip_with_metadata(tmp_path):
    ck = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3)
    assert ck.latest_step() is None
    state = _state(7)
    meta = dict(
        data={"__bytes__": "\x00\xffstate"},
        history={"eval": [{"step": 3, "eval/pass@1_greedy": 0.25}]},
        config=dict(lr=1e-3, name="x"),
        value=np.float32(0.5),  # numpy scalars become plain JSON numbers
        order=(1, 2),
    )
    ck.save(3, state, meta)
    ck.wait()
    assert ck.latest_step() == 3
    restored, got = ck.restore(abstract_like(state))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.dtype == b.dtype
    assert got["data"] == meta["data"]
    assert got["history"] == meta["history"]
    assert got["config"] == dict(lr=1e-3, name="x")
    assert got["value"] == 0.5 and got["order"] == [1, 2]
    ck.close()


def test_max_to_keep_and_restore_older_step(tmp_path):
    ck = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=2)
    for step in (1, 2, 3, 4):
        ck.save(step, _state(step), dict(step=step))
    ck.wait()
    assert ck.all_steps() == [3, 4]
    assert ck.latest_step() == 4
    state, meta = ck.restore(abstract_like(_state(0)), step=3)
    assert int(state["step"]) == 3 and meta == dict(step=3)
    np.testing.assert_array_equal(np.asarray(state["params"]["b"]), np.arange(4) + 3.0)
    ck.close()
    # A new Checkpointer on the same directory sees the same steps (a resumed run).
    again = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=2)
    assert again.latest_step() == 4
    again.close()


def test_set_aside_after_keeps_the_later_steps_and_saves_them_again(tmp_path):
    """A run rolled back to step 2 (a population's members resumed at one step): steps 3
    and 4 move to ckpt.set_aside, the newest restorable is 2, and step 3 saves again."""
    ck = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=4, async_save=False)
    for step in (1, 2, 3, 4):
        ck.save(step, _state(step), dict(step=step))
    assert ck.set_aside_after(2) == [3, 4]
    assert ck.all_steps() == [1, 2] and ck.set_aside_after(2) == []
    aside = sorted(p.name.split("-")[0] for p in (tmp_path / "ckpt.set_aside").iterdir())
    assert aside == ["3", "4"]
    state, meta, step = ck.restore_latest(abstract_like(_state(0)))
    assert step == 2 and meta == dict(step=2) and int(state["step"]) == 2
    ck.save(3, _state(30), dict(step=3))
    assert ck.all_steps() == [1, 2, 3]
    ck.close()


def test_restore_missing_raises(tmp_path):
    ck = Checkpointer(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ck.restore(abstract_like(_state(0)))


def test_non_json_metadata_is_an_error_naming_the_type(tmp_path):
    ck = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    with pytest.raises(TypeError, match="object"):
        ck.save(1, _state(1), dict(bad=object()))


def test_restore_onto_sharded_target(tmp_path):
    """Saved from one device, restored onto an 8-device mesh: values equal, target shardings."""
    ck = Checkpointer(str(tmp_path / "ckpt"))
    w = jnp.arange(64, dtype=jnp.float32).reshape(8, 8)
    ck.save(1, dict(w=w), {})
    ck.wait()
    mesh = sharding.make_mesh([-1, 1, 1])
    target_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    target = dict(w=jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=target_sharding))
    restored, _ = ck.restore(target)
    assert restored["w"].sharding == target_sharding
    assert len(restored["w"].addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(w))


def test_restore_latest_skips_a_damaged_step_and_names_the_file(tmp_path):
    ck = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3)
    for step in (1, 2, 3):
        ck.save(step, _state(step), dict(step=step))
    ck.wait()
    assert (tmp_path / "ckpt" / ".manifest-3.json").exists()  # sizes of the finalised steps
    (tmp_path / "ckpt" / "3" / "meta" / "metadata").write_text("{oops")
    warnings = []
    ck = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3)
    state, meta, step = ck.restore_latest(abstract_like(_state(0)), warn=warnings.append)
    assert step == 2 and meta == dict(step=2)
    np.testing.assert_array_equal(np.asarray(state["params"]["b"]), np.arange(4) + 2)
    assert warnings[0].startswith(
        f"checkpoint step 3 is damaged ({tmp_path / 'ckpt' / '3' / 'meta' / 'metadata'} "
    )
    assert ck.all_steps() == [1, 2]  # moved aside: the resumed run can save step 3 again
    assert [p.name.split("-")[0] for p in (tmp_path / "ckpt.damaged").iterdir()] == ["3"]
    assert Checkpointer(str(tmp_path / "empty")).restore_latest(abstract_like(_state(0))) is None


def test_copy_step_names_missing_steps_and_is_a_noop_once_seeded(tmp_path):
    src, dst = tmp_path / "a", tmp_path / "b"
    (src / "2" / "meta").mkdir(parents=True)
    (src / "2" / "meta" / "metadata").write_text(json.dumps({"history": {}, "config": {}}))
    with pytest.raises(CheckpointError, match=r"no checkpoint step 5 in .*a \(its steps: \[2\]\)"):
        copy_step(str(src), 5, str(dst))
    (tmp_path / "b.seeding" / "2").mkdir(parents=True)  # a stage left by a kill
    assert copy_step(str(src), 2, str(dst), edit_meta=lambda m: {**m, "x": 1})
    assert json.loads((dst / "2" / "meta" / "metadata").read_text())["x"] == 1
    assert "x" not in json.loads((src / "2" / "meta" / "metadata").read_text())
    assert not (tmp_path / "b.seeding").exists() and step_dirs(str(dst)) == [2]
    assert not copy_step(str(src), 2, str(dst))  # seeded: the run resumes from its own
