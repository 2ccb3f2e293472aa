"""Device mesh and parameter placement from logical axis names.

The mesh has axes ('data', 'fsdp', 'sequence', 'tensor'). Parameters carry logical axis
names (`logical_axes` metadata on each `nnx.Param`: 'vocab', 'embed', 'heads', 'kv_heads',
'mlp', 'expert'); a rules table maps each logical name to a mesh axis. Batches are split
over ('data', 'fsdp'). The same code runs on 1 CPU, 8 fake CPU devices, a GPU, or a TPU slice.

The `sequence` axis is context parallelism: in a forward over whole rows (the update and
the log-prob passes) each device along it holds a slice of every row's positions
(`activation_sharding`, applied by `Transformer.constrain_rows`), and attention gathers the
keys and values of the whole row. Weights are split over fsdp x sequence (the `embed`
rule: ZeRO-3 over both). The rows a batch is placed with stay whole on every device of the
axis (token ids are small) and each device takes its slice inside the program.

A dimension whose size the mesh axis does not divide is replicated instead (e.g. 2 kv heads
on a tensor axis of 4): correct everywhere, and the choice is visible in `describe`.

A population's members (run/population/driver.py) may be split over one more, outermost axis,
'population' (`make_mesh(population=P)`, `mesh.population`): the mesh is then (population,
data, fsdp, sequence, tensor), P blocks of devices each of the (data, fsdp, sequence, tensor)
shape. Only the members' stacked programs name it (`jax.vmap(spmd_axis_name=)` over a
leading [N] member axis placed on it: run/population/batched_update.py and
batched_sampling.py); every other spec leaves it out and so is replicated over it. A mesh of
P = 1 has no such axis: it is the four-axis mesh it always was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "sequence", "tensor")
BATCH_AXES = ("data", "fsdp")
SEQUENCE_AXIS = "sequence"  # context parallelism: a row's positions split over this axis
# a population's members, split over the outermost axis (the module docstring); absent when 1
POPULATION_AXIS = "population"
# a mesh shape given as three sizes is (data, fsdp, tensor) with no sequence axis
_THREE_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis (or None to replicate)
DEFAULT_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", BATCH_AXES),
    ("length", SEQUENCE_AXIS),  # an activation's positions (context parallelism)
    ("layers", None),  # stacked layer parameters: every device holds its shard of every layer
    # the vocabulary over tensor x fsdp, claimed before `embed` (rules listed first claim
    # their mesh axes first): the [V, D] embedding and [D, V] output layer are split by
    # vocabulary rows, so the lookup and the logits run vocab-parallel (Megatron-LM): each
    # device reads its rows and computes its [.., V / S] logits from the gathered [.., D]
    # activations, and no device gathers the whole table (544 MB in f32 at Qwen2.5-0.5B)
    # or holds its whole gradient
    ("vocab", ("tensor", "fsdp")),
    # a mixture of experts' stacked [E, ...] expert weights split by expert over fsdp, claimed
    # before `embed`: each device holds E / fsdp whole experts and the tokens travel to them
    # (expert parallelism, models/moe.py), instead of every layer's experts being gathered
    ("expert", "fsdp"),
    # the hidden size over fsdp and the sequence axis: ZeRO-3 over both, so a sequence axis
    # also divides the weights, gradients and optimizer state (each layer's weights are
    # gathered from fsdp x sequence devices), instead of every device along it holding them
    ("embed", ("fsdp", SEQUENCE_AXIS)),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
)


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Fill the single -1 entry of `shape` with the remaining devices; check the product.
    `shape`: one size per `MESH_AXES` entry, or three sizes (data, fsdp, tensor) for a mesh
    without a sequence axis. Returns the four sizes."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == len(_THREE_AXES):
        shape = (shape[0], shape[1], 1, shape[2])
    if len(shape) != len(MESH_AXES):
        raise ValueError(
            f"mesh shape {shape} must have {len(MESH_AXES)} entries {MESH_AXES} "
            f"(or 3: {_THREE_AXES})"
        )
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape {shape}: at most one entry may be -1")
    if any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh shape {shape}: sizes must be positive or -1")
    known = math.prod(s for s in shape if s != -1)
    if num_devices % known:
        raise ValueError(
            f"mesh shape {dict(zip(MESH_AXES, shape))} does not divide the {num_devices} "
            f"available devices (product of fixed sizes is {known})"
        )
    filled = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(filled) != num_devices:
        raise ValueError(
            f"mesh shape {dict(zip(MESH_AXES, filled))} uses {math.prod(filled)} devices, "
            f"but {num_devices} are available; use -1 for one axis to take the rest"
        )
    return filled


def mesh_sizes(section: Mapping[str, int]) -> list[int]:
    """The sizes of `MESH_AXES` from a config section (`mesh`, `rollout.mesh`): an axis the
    section does not name is 1."""
    return [int(section.get(a, 1)) for a in MESH_AXES]


def make_mesh(
    shape: Sequence[int] | Mapping[str, int] = (-1, 1, 1), devices=None, population: int = 1
) -> Mesh:
    """A Mesh with axes (data, fsdp, sequence, tensor). `shape`: four sizes, three (data,
    fsdp, tensor; sequence 1), or a dict by axis name (absent axes 1; it may hold
    'population'). population P > 1: an outer 'population' axis of P blocks of the devices,
    each of `shape` over 1 / P of them (its -1 takes the rest of a block)."""
    if isinstance(shape, Mapping):
        unknown = set(shape) - {*MESH_AXES, POPULATION_AXIS}
        if unknown:
            allowed = (POPULATION_AXIS, *MESH_AXES)
            raise ValueError(f"unknown mesh axes {sorted(unknown)}; allowed: {allowed}")
        population = int(shape.get(POPULATION_AXIS, population))
        shape = [shape.get(a, 1) for a in MESH_AXES]
    devices = list(jax.devices() if devices is None else devices)
    if population < 1 or len(devices) % population:
        raise ValueError(
            f"mesh population axis {population} must be >= 1 and divide the {len(devices)} devices"
        )
    dims = resolve_mesh_shape(shape, len(devices) // population)
    if population == 1:  # no population axis: the mesh every run without one has
        return Mesh(np.asarray(devices).reshape(dims), MESH_AXES)
    return Mesh(np.asarray(devices).reshape(population, *dims), (POPULATION_AXIS, *MESH_AXES))


def population_axis(mesh: Mesh | None) -> str | None:
    """The mesh's population axis name (`POPULATION_AXIS`), or None: no mesh, or a mesh
    without one (population 1), over which a member axis stays replicated."""
    names = () if mesh is None else mesh.axis_names
    return POPULATION_AXIS if POPULATION_AXIS in names else None


def logical_to_spec(
    logical_axes: Sequence[str | None] | None,
    shape: Sequence[int],
    mesh: Mesh,
    rules=DEFAULT_RULES,
) -> PartitionSpec:
    """PartitionSpec for an array with these logical axes; indivisible dims stay replicated.

    A mesh axis splits at most one dim; where two dims name the same axis, the dim whose
    logical name comes first in `rules` gets it (the vocabulary before `embed`)."""
    if logical_axes is None:
        return PartitionSpec()
    table = dict(rules)
    rank = {name: i for i, (name, _) in enumerate(rules)}
    dims = list(zip(logical_axes, shape, strict=True))
    used: set[str] = set()
    spec: list = [None] * len(dims)
    for i in sorted(range(len(dims)), key=lambda i: rank.get(dims[i][0], len(rank))):
        name, size = dims[i]
        target = table.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used and mesh.shape.get(a, 1) > 1)
        if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
            used.update(axes)
            spec[i] = axes[0] if len(axes) == 1 else axes
    return PartitionSpec(*spec)


def mesh_of(x: jax.Array) -> Mesh | None:
    """The mesh of more than one device that x (an array or a tracer) is laid out on, or
    None: one device, no mesh, a mesh without the batch axes, or inside a shard_map (a
    device's own rows: nothing to place)."""
    mesh = getattr(jax.typeof(x).sharding, "mesh", None)
    if mesh is None or not set(BATCH_AXES) <= set(mesh.shape) or mesh.size == 1:
        return None
    if jax.sharding.AxisType.Manual in getattr(mesh, "axis_types", ()):
        return None
    return mesh


def constrain_vocab(z: jax.Array, like: jax.Array) -> jax.Array:
    """z [N, ..., V] (logits, or a chunk of them) with V split as the vocabulary rule splits
    it, N over the batch axes the vocabulary leaves free (`data` with the default rules)
    and the rest whole, on the mesh `like` (the output layer) is placed on; z as it is
    without a mesh. The vocab-parallel output layer of Megatron-LM (Shoeybi et al., 2019):
    each device computes its V / S share of the logits from the gathered [.., D]
    activations, the log-softmax reduces over the devices, and the [D, V] weight and its
    gradient stay split. Left to itself, XLA laid a chunk of rows-split positions out by
    its rows and gathered the whole table on every device (at Qwen2.5-0.5B in f32: 544 MB,
    and as much again for its gradient). With a sequence axis, N is also split over it:
    the rows of z are the positions of each device's own slice of the row
    (`logprobs.chunked_token_stats`)."""
    mesh = mesh_of(like)
    if mesh is None:
        return z
    vocab = logical_to_spec(("vocab",), z.shape[-1:], mesh)[0]
    if vocab is None:  # an indivisible vocabulary: replicated, nothing to lay out
        return z
    used = {vocab} if isinstance(vocab, str) else set(vocab)
    # the positions' own split over the sequence axis stays (context parallelism)
    lead_axes = (*BATCH_AXES, SEQUENCE_AXIS)
    free = tuple(a for a in lead_axes if a not in used and mesh.shape.get(a, 1) > 1)
    lead = None
    if free and z.ndim > 1 and z.shape[0] % math.prod(mesh.shape[a] for a in free) == 0:
        lead = free[0] if len(free) == 1 else free
    spec = PartitionSpec(*((lead,) if z.ndim > 1 else ()), *([None] * (z.ndim - 2)), vocab)
    return jax.lax.with_sharding_constraint(z, NamedSharding(mesh, spec))


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def state_shardings(state: nnx.State, mesh: Mesh, rules=DEFAULT_RULES):
    """The NamedSharding of every variable of `state` (same tree structure)."""

    def one(var):
        meta = var.get_metadata() if hasattr(var, "get_metadata") else {}
        # get_value, not var[...]: the state may be abstract (ShapeDtypeStruct leaves, from
        # nnx.eval_shape), which cannot be indexed
        spec = logical_to_spec(meta.get("logical_axes"), var.get_value().shape, mesh, rules)
        return var.replace(NamedSharding(mesh, spec))

    return jax.tree.map(one, state, is_leaf=_is_var)


def shard_model(model: nnx.Module, mesh: Mesh, rules=DEFAULT_RULES) -> nnx.Module:
    """Place every parameter of `model` (in place) by its logical axes."""
    state = nnx.state(model)
    shardings = state_shardings(state, mesh, rules)
    nnx.update(model, jax.device_put(state, shardings))
    return model


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading (batch) dim over ('data', 'fsdp'), the rest replicated."""
    axes = tuple(a for a in BATCH_AXES if mesh.shape[a] > 1)
    lead = axes if len(axes) > 1 else (axes[0] if axes else None)
    return NamedSharding(mesh, PartitionSpec(lead, *([None] * (ndim - 1))))


def activation_sharding(mesh: Mesh, x, positions: bool = False) -> NamedSharding:
    """The sharding of an activation x [B, ...]: rows over the batch axes; positions=True,
    x [B, T, ...] with T also split over the `sequence` axis (context parallelism). A dim
    its axes do not divide stays whole (`logical_to_spec`)."""
    axes = ("batch",) + (("length",) if positions and x.ndim > 1 else ())
    axes += (None,) * (x.ndim - len(axes))
    return NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh))


def sequence_size(mesh: Mesh | None) -> int:
    """Devices along the mesh's sequence axis (1: no context parallelism, or no mesh)."""
    return 1 if mesh is None else int(mesh.shape.get(SEQUENCE_AXIS, 1))


def fold_sequence(mesh: Mesh) -> Mesh:
    """`mesh` with its sequence axis folded into fsdp: the same devices in the same order,
    shape (data, fsdp * sequence, 1, tensor) (a population axis kept in front). A weight
    split over ('fsdp', 'sequence') (the `embed` rule) is split over 'fsdp' here on the same
    devices, and rows split over the batch axes take every device of a member's block: the
    sampler's mesh, which has no use for a split of positions (a decode step has one)."""
    s = sequence_size(mesh)
    if s == 1:
        return mesh
    names = tuple(mesh.axis_names)
    # fsdp and sequence are neighbours, so merging them keeps every device's place
    dims = [mesh.shape[a] * (s if a == "fsdp" else 1) for a in names]
    dims[names.index(SEQUENCE_AXIS)] = 1
    return Mesh(mesh.devices.reshape(dims), names)


def batch_size_multiple(mesh: Mesh) -> int:
    """Global batch sizes must be multiples of this (devices along the batch axes)."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def is_process_local(mesh: Mesh) -> bool:
    """Every device of `mesh` is this process's: a mesh of one host (its programs talk to no
    other process), e.g. the rollout mesh of asynchronous rollouts on several hosts."""
    return all(d.process_index == jax.process_index() for d in mesh.devices.flat)


def process_stacked_mesh(local: Mesh, pool: Sequence) -> Mesh | None:
    """A mesh ('process', data, fsdp, tensor) holding, for each process p, the mesh of
    `local`'s shape over p's devices of `pool` in pool order (as `make_mesh` built this
    process's `local` from its own devices); None where this process's block is not `local`
    or the blocks do not cover `pool` (the rollout devices are not the pool's)."""
    blocks = []
    for p in range(jax.process_count()):
        own = [d for d in pool if d.process_index == p]
        if len(own) != local.devices.size:
            return None
        blocks.append(np.asarray(own, dtype=object).reshape(local.devices.shape))
    stacked = np.stack(blocks)
    if not (stacked[jax.process_index()] == local.devices).all():
        return None
    return Mesh(stacked, ("process", *local.axis_names))


def _identity(x):
    """A reshard is a jitted identity with new output shardings. One function object, so
    jit's trace and compile caches hit on every later step (a lambda per call would compile
    the reshard again each time)."""
    return x


def gather_to_local_mesh(state: nnx.State, local: Mesh) -> nnx.State:
    """`state` (on a mesh over every process's devices) -> the same values laid out on
    `local`, this process's own devices, by their logical axes: a collective, so every
    process calls it at the same point of the run.

    On device: one jitted reshard onto the mesh that stacks every process's counterpart of
    `local` on a 'process' axis (`process_stacked_mesh`), replicated over that axis (XLA's
    all-gather), after which this process's shards are already the arrays of `local` and
    are taken as they are. Where no such mesh covers the state's devices (rollouts on
    devices of their own), the values go through the host (`process_allgather`)."""
    local_shardings = state_shardings(state, local)
    source_mesh = getattr(jax.tree.leaves(state)[0].sharding, "mesh", None)
    stacked = (
        None if source_mesh is None else process_stacked_mesh(local, list(source_mesh.devices.flat))
    )
    if stacked is None:
        from jax.experimental import multihost_utils

        host = multihost_utils.process_allgather(state, tiled=True)
        return jax.device_put(host, local_shardings)
    stacked_shardings = jax.tree.map(lambda s: NamedSharding(stacked, s.spec), local_shardings)
    gathered = jax.jit(_identity, out_shardings=stacked_shardings)(state)

    def localize(x, sharding):
        shards = [shard.data for shard in x.addressable_shards]
        return jax.make_array_from_single_device_arrays(x.shape, sharding, shards)

    return jax.tree.map(localize, gathered, local_shardings)


def shard_batch(tree, mesh: Mesh):
    """Place host arrays (global batch, identical on every process) with their batch dim split.

    Each process contributes its addressable shard through
    `jax.make_array_from_process_local_data`, so the same call works on several hosts.
    """

    def one(x):
        x = np.asarray(x)
        sharding = batch_sharding(mesh, max(x.ndim, 1))
        if x.ndim == 0:
            return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
        n = batch_size_multiple(mesh)
        if x.shape[0] % n:
            raise ValueError(
                f"batch dimension {x.shape[0]} is not divisible by the {n} devices of the "
                f"batch axes {BATCH_AXES} of mesh {dict(mesh.shape)}"
            )
        if jax.process_count() == 1 or is_process_local(mesh):
            return jax.device_put(x, sharding)
        # host-local slice of the global batch
        per = x.shape[0] // jax.process_count()
        local = x[jax.process_index() * per : (jax.process_index() + 1) * per]
        return jax.make_array_from_process_local_data(sharding, local, x.shape)

    return jax.tree.map(one, tree)


def shard_local_batch(tree, mesh: Mesh):
    """Place this process's rows: the global batch is every process's rows, in process order.

    Each leaf is a host array [B_local, ...]; the result is a global array [B_local *
    process_count, ...] split over the batch axes (`jax.make_array_from_process_local_data`).
    Rows never leave the host that produced them. On one process this is `shard_batch`.
    """

    def one(x):
        x = np.asarray(x)
        n = batch_size_multiple(mesh)
        global_rows = x.shape[0] * jax.process_count()
        if global_rows % n:
            raise ValueError(
                f"{x.shape[0]} rows on each of {jax.process_count()} processes do not split over "
                f"the {n} devices of the batch axes {BATCH_AXES} of mesh {dict(mesh.shape)}"
            )
        sharding = batch_sharding(mesh, x.ndim)
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        return jax.make_array_from_process_local_data(sharding, x, (global_rows, *x.shape[1:]))

    return jax.tree.map(one, tree)


def local_rows(x: jax.Array, mesh: Mesh) -> np.ndarray:
    """This process's rows of a global batch-major array, as numpy: rows [i B / n, (i+1) B / n)
    for process i of n, the rows its own prompts produced (the inverse of `shard_local_batch`).

    The array is first laid out over the batch axes, where each process addresses exactly its
    contiguous block of rows (devices are ordered process by process), so no row crosses a host.
    """
    if jax.process_count() == 1 or x.is_fully_addressable:  # one process's array: all its own
        return np.asarray(jax.device_get(x))
    n, i = jax.process_count(), jax.process_index()
    per = x.shape[0] // n
    if x.shape[0] % n:
        raise ValueError(f"{x.shape[0]} rows do not split over {n} processes")
    mesh = getattr(x.sharding, "mesh", mesh)  # the array's own mesh (e.g. the rollout mesh)
    x = _relayout(x, batch_sharding(mesh, x.ndim))
    blocks = {s.index[0].start or 0: s.data for s in x.addressable_shards}  # replicas dedup
    starts = sorted(blocks)
    local = np.concatenate([np.asarray(blocks[s]) for s in starts])
    if starts[0] != i * per or local.shape[0] != per:
        raise ValueError(
            f"process {i} addresses rows {starts[0]}..{starts[0] + local.shape[0]} of "
            f"{x.shape[0]}, not its own block {i * per}..{(i + 1) * per}: the mesh's devices "
            "must be ordered process by process (jax.devices() order)"
        )
    return local


def _relayout(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    if x.sharding == sharding:
        return x
    return jax.jit(lambda a: a, out_shardings=sharding)(x)


def all_rows(x: jax.Array) -> np.ndarray:
    """The whole of a (possibly multi-host) array on every process, as numpy."""
    if jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def host_copy(tree):
    """Arrays a process can read whole (to export or inspect): on one process the tree as it
    is; on several, every process gathers a full host copy (all must call it)."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def describe(state: nnx.State) -> dict[str, str]:
    """{'layers.0.attn.q_proj': 'PartitionSpec(...)'} for logging and tests."""
    out = {}
    for path, var in nnx.to_flat_state(state) if hasattr(nnx, "to_flat_state") else []:
        value = var[...] if _is_var(var) else var
        out[".".join(map(str, path))] = str(getattr(value.sharding, "spec", value.sharding))
    return out


def sharded_forward(model: nnx.Module, mesh: Mesh, rules=DEFAULT_RULES):
    """A jitted `forward(tokens, attention_mask) -> logits` with explicit shardings.

    The model is split once; the jitted function takes its state as an argument (no
    retracing per call, no weight copy per call).
    """
    graphdef, state = nnx.split(model)
    param_sh = state_shardings(state, mesh, rules)
    data_sh = batch_sharding(mesh, 2)
    logits_sh = batch_sharding(mesh, 3)

    @jax.jit
    def _fwd(state, tokens, attention_mask):
        return nnx.merge(graphdef, state)(tokens, attention_mask)

    fwd = jax.jit(_fwd, in_shardings=(param_sh, data_sh, data_sh), out_shardings=logits_sh)

    def forward(tokens, attention_mask):
        tokens, attention_mask = shard_batch((tokens, attention_mask), mesh)
        return fwd(nnx.state(model), tokens, attention_mask)

    return forward
