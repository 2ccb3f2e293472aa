"""A population's rollouts of one step in one sampler program (`population.batched_sampling`).

    MemberSampler(sampler).prepare([MemberRequest, ...])   one vmapped prefill + decode
                                                           over a leading member axis
    MemberSampler.generate(...)                            member i's prepared rollout
                                                           (the plain sampler's otherwise)

The members' weights are stacked on a leading [N] axis, except the leaves every member holds
as the same array (LoRA's frozen base: `in_axes` None, held once); prompts, keys, sampling
knobs and versions are stacked too. Each member's rows are those the plain `Sampler.generate`
draws from its weights, prompts and key (the same `prefill_body` and `decode_body`, vmapped), up to
the order of f32 reductions in the batched matmuls. The producer then asks for its rows as
always (`generate`), and this sampler hands back the one prepared for its key; a call with
another key (an extra draw of dynamic sampling) runs the plain sampler. Members whose prompts
pad to other bucket shapes or whose `Plan`s differ run in separate groups. On a sampler mesh
with a population axis (`mesh.population`, core/sharding.py) a group's stacked member axis is
placed on it and the vmap names it (`spmd_axis_name`), so each block of devices samples its
own members with the sampler's layout inside; a group whose size the axis does not divide
runs with the member axis replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.core.xla_options import rollout_compiler_options
from jaxrl_frontier.sampling.params import Knobs, Plan, SamplingParams
from jaxrl_frontier.sampling.sampler import Sampler, as_key


@dataclasses.dataclass(frozen=True)
class MemberRequest:
    """One member's rollout: host prompts [P, T], its sampling values, key, weights, version."""

    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    params: SamplingParams
    key: jax.Array
    weights: Any
    version: int


class MemberSampler:
    """The plain `sampler` (its attributes read through) with the members' prepared rollouts
    (module docstring)."""

    def __init__(self, sampler: Sampler):
        if type(sampler) is not Sampler or sampler.record_routing:
            raise TypeError(
                f"MemberSampler batches the plain Sampler (no routing record), not "
                f"{type(sampler).__name__}"
            )
        self.sampler = sampler
        self._jits: dict = {}
        self._ready: dict[bytes, tuple[np.ndarray, Any]] = {}  # key -> (prompts, rollout)
        self.compiles = 0  # programs built (one per member group shape and Plan)
        self.shared_leaves = 0  # the last prepare's weights leaves held once (in_axes None)

    def __getattr__(self, name: str):
        return getattr(self.sampler, name)

    def prepare(self, requests: list[MemberRequest]) -> None:
        """Sample every member's rows now (module docstring); `generate` hands them out."""
        s = self.sampler
        padded = [s.pad_prompts(r.prompt_tokens, r.prompt_mask) for r in requests]
        groups: dict[tuple, list[int]] = {}
        for i, (r, ((tok, _), _)) in enumerate(zip(requests, padded)):
            groups.setdefault((tok.shape, Plan.of(r.params)), []).append(i)
        out: dict[int, Any] = {}
        for (_, plan), members in groups.items():
            rollouts = self._run([requests[i] for i in members], [padded[i] for i in members], plan)
            out.update(zip(members, rollouts))
        self._ready = {
            _key_bytes(r.key): (np.asarray(r.prompt_tokens), out[i]) for i, r in enumerate(requests)
        }

    def _run(self, requests: list[MemberRequest], padded: list, plan: Plan) -> list:
        """One vmapped prefill + decode of these members (one prompt bucket, one Plan)."""
        s = self.sampler
        tokens, num_prompts = padded[0][0][0], padded[0][1]
        flat = [jax.tree.leaves(r.weights) for r in requests]
        # a leaf every member holds as the same array (LoRA's base): passed once, in_axes None
        axes = tuple(None if all(x is f[j] for f in flat) else 0 for j, x in enumerate(flat[0]))
        self.shared_leaves = axes.count(None)
        treedef, specs = jax.tree.structure(requests[0].weights), None
        if s.mesh is not None:  # each leaf's placement on the sampler's mesh (`update_weights`)
            placed = shd.state_shardings(requests[0].weights, s.mesh)
            specs = tuple(sh.spec for sh in jax.tree.leaves(placed))
        program = self._program(treedef, axes, specs, plan, tokens.shape, len(requests))
        flat = [[x for x, a in zip(f, axes) if a == 0 or i == 0] for i, f in enumerate(flat)]
        return program(
            flat,
            [p[0] for p in padded],
            [jax.random.key_data(as_key(r.key)) for r in requests],
            [Knobs.of(r.params, 0) for r in requests],
            [np.int32(r.version) for r in requests],
            num_prompts * plan.n,
        )

    def _program(self, treedef, axes: tuple, specs, plan: Plan, shape: tuple, members: int):
        """The jitted program: the members' inputs (lists) stacked, the vmapped prefill and
        decode, each member's rollout (its first `rows` rows) split off; built once per
        weights structure and placement, Plan, prompt shape and member count."""
        sig = (treedef, axes, specs, plan, shape, members)
        if sig in self._jits:
            return self._jits[sig]
        s = self.sampler
        slots = s.first_cache_size(shape[1], plan) - shape[1]
        # the member axis on the mesh's population axis where it divides the group's members
        # (each block of devices samples its own members), else replicated
        axis = shd.population_axis(s.mesh)
        axis = axis if axis and members % s.mesh.shape[axis] == 0 else None

        def place(x, j: int, stacked: bool):  # a stacked leaf: the member axis on `axis`
            if specs is None:
                return x
            spec = PartitionSpec(axis, *specs[j]) if stacked else specs[j]
            return jax.lax.with_sharding_constraint(x, NamedSharding(s.mesh, spec))

        def member_generate(state, tokens, mask, key, knobs, version):
            cache, logits0, prompt_len = s.prefill_body(
                state, tokens, mask, key, knobs, n=plan.n, use_dropout=plan.use_dropout,
                slots=slots,
            )  # fmt: skip
            rollout, _ = s.decode_body(
                state, cache, logits0, prompt_len, (tokens, mask), key, knobs, version, plan=plan
            )
            return rollout

        def members_generate(flat, prompts, keys, knobs, versions, rows):
            leaves, shared = [], iter(flat[0])
            for j, a in enumerate(axes):
                first = next(shared)
                if a is None:
                    leaves.append(place(first, j, False))
                else:
                    k = sum(1 for b in axes[:j] if b == 0)
                    leaves.append(place(jnp.stack([first] + [f[k] for f in flat[1:]]), j, True))
            stack = lambda xs: jax.tree.map(lambda *x: jnp.stack(x), *xs)  # noqa: E731
            state = jax.tree.unflatten(treedef, leaves)
            tok, msk = stack(prompts)
            vmapped = jax.vmap(
                member_generate,
                in_axes=(jax.tree.unflatten(treedef, list(axes)), 0, 0, 0, 0, 0),
                spmd_axis_name=axis,  # the sampler's row constraints within each block
            )
            out = vmapped(
                state,
                tok,
                msk,
                jax.random.wrap_key_data(stack(keys)),
                stack(knobs),
                stack(versions),
            )
            return [jax.tree.map(lambda x, i=i: x[i, :rows], out) for i in range(members)]

        options = rollout_compiler_options(
            s.platform, members * shape[0] * plan.n // s.batch_multiple
        )
        self._jits[sig] = jax.jit(
            members_generate, static_argnames=("rows",), compiler_options=dict(options)
        )
        self.compiles += 1
        return self._jits[sig]

    def generate(
        self, prompt_tokens, prompt_mask, params, key, *, policy_version=None, first_row=0
    ):
        """The rollout prepared for this key (each handed out once; it must be of these
        prompts), or for a key none was prepared for (an extra draw of dynamic sampling) the
        plain sampler's."""
        ready = self._ready.pop(_key_bytes(key), None)
        if ready is None:
            return self.sampler.generate(
                prompt_tokens, prompt_mask, params, key, policy_version=policy_version,
                first_row=first_row,
            )  # fmt: skip
        want_tokens, rollout = ready
        if not np.array_equal(want_tokens, prompt_tokens):
            raise RuntimeError("MemberSampler: a rollout asked for other prompts than prepared")
        return rollout


def _key_bytes(key) -> bytes:
    return np.asarray(jax.device_get(jax.random.key_data(as_key(key)))).tobytes()
