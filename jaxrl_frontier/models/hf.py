"""Hugging Face checkpoints (config.json + safetensors) <-> `Transformer`, both directions.

    model = hf.load("/ckpt/Qwen3-0.6B", mesh=mesh, dtype="bfloat16")
    logits = model(tokens, attention_mask)          # [B, T, V]
    hf.save(model, "/out/policy", dtype="bfloat16")  # transformers / vLLM load this

Supported architectures live in the `ARCHITECTURES` registry (HF `architectures[0]` ->
`Architecture`): LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM,
Gemma3ForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, GptOssForCausalLM,
DeepseekV3ForCausalLM, Qwen3_5ForCausalLM and Qwen3_5MoeForCausalLM (hybrid: per-layer
parameters, models/qwen3_5.py names their tensors). All share the tensor names of
`model.layers.{i}...`; they differ in config fields (qkv bias, qk-norm,
the Gemma fields, GPT-OSS's biases and sinks), Gemma's two extra norms per layer and, for
the mixtures of experts, the MLP's tensors (`mlp.gate.weight`, the router, and
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`, stacked into [L, E, ...] parameters;
Qwen2-MoE's `mlp.shared_expert.*`; GPT-OSS's `mlp.router.*` and a layer's experts fused in
`mlp.experts.gate_up_proj` / `down_proj` and their biases).

The tensor names and layouts, both ways: tensor_map.py.

The model's layers are stacked (`Transformer.layers`: one [L, ...] array per parameter);
the checkpoint keeps HF's per-layer names (`model.layers.{i}.self_attn.q_proj.weight`), so
loading stacks the L tensors of a parameter and saving writes layer i's slice under layer
i's name.

Loading never materialises the model on one device: the model is built abstractly
(`nnx.eval_shape`), the tensors are read to host memory one parameter at a time (for a
stacked parameter its L per-layer tensors) and placed with `jax.make_array_from_callback`,
so each device receives only its own shard.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  registers bfloat16 with numpy, so safetensors can read BF16
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxrl_frontier.core.errors import ModelFileError
from jaxrl_frontier.core.sharding import DEFAULT_RULES, state_shardings
from jaxrl_frontier.models import gguf_file
from jaxrl_frontier.models.architectures import (
    ARCHITECTURES,
    Architecture,
    architecture_for,
    architecture_of,
    config_from_hf,
    config_to_hf,
)
from jaxrl_frontier.models.hybrid import model_class
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.multi_token import (
    HF_COUNT_KEY,
    MultiTokenPredictor,
    mtp_tensor_specs,
    shared_copies,
)
from jaxrl_frontier.models.qwen3_5 import checkpoint_specs
from jaxrl_frontier.models.tensor_map import TensorSpec, hf_tensors, tensor_specs
from jaxrl_frontier.models.transformer import Transformer

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHARD_NAME = "model-{:05d}-of-{:05d}.safetensors"
_SHARD_RE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
# Tensors some checkpoints carry that hold no parameters of ours (old Llama exports).
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _layer_of(name: str) -> int:
    """The layer index in a tensor's name (-1 for a tensor outside the layers)."""
    m = _LAYER.match(name)
    return -1 if m is None else int(m[1])


# ----------------------------------------------------------------------------- reading


def read_config(path: str | os.PathLike) -> dict:
    """The config.json dict of a checkpoint directory."""
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no {CONFIG_FILE} in checkpoint directory {str(path)!r}")
    try:
        with open(file) as fh:
            return json.load(fh)
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{file}: invalid JSON at line {e.lineno}: {e.msg}") from None


def _weight_map(path: str) -> dict[str, str]:
    """{tensor name: safetensors file name} from the index, the single file, or a glob."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index) as fh:
                weight_map = json.load(fh)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelFileError(f"{index}: not a safetensors index ({e!r})") from None
        for file in sorted(set(weight_map.values())):
            if not os.path.isfile(os.path.join(path, file)):
                raise FileNotFoundError(
                    f"{INDEX_FILE} in {path!r} names {file!r}, which is missing"
                )
        return weight_map
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        others = sorted(
            f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth", ".msgpack"))
        )
        hint = f" (found {others}: re-save with safe_serialization=True)" if others else ""
        raise FileNotFoundError(f"no *.safetensors files in checkpoint directory {path!r}{hint}")
    weight_map = {}
    for file in files:
        with _safe_open(os.path.join(path, file)) as f:
            weight_map.update({name: file for name in f.keys()})
    return weight_map


def _safe_open(file: str):
    """safe_open, with an unreadable file (truncated, not safetensors) named in the error."""
    try:
        return safe_open(file, framework="numpy")
    except Exception as e:
        raise ModelFileError(f"{file}: not a readable safetensors file: {e}") from None


@contextlib.contextmanager
def _tensor_reader(path: str, weight_map: dict[str, str], stored=None) -> Iterator:
    """read(name) -> host array; each safetensors file is opened once, on first use.
    stored: {name: the name it has in the file} where they differ."""
    with contextlib.ExitStack() as stack:
        handles = {}

        def read(name: str) -> np.ndarray:
            file = weight_map[name]
            if file not in handles:
                handles[file] = stack.enter_context(_safe_open(os.path.join(path, file)))
            try:
                return handles[file].get_tensor((stored or {}).get(name, name))
            except Exception as e:  # a truncated file: safetensors names neither file nor tensor
                raise ModelFileError(
                    f"{os.path.join(path, file)}: cannot read tensor {name!r}: {e}"
                ) from None

        yield read


# Gemma3ForConditionalGeneration: its language model's tensors under the prefixes
# transformers has saved them with (the hub's, and the in-memory module path of some
# versions); the vision tower and projector are not read.
_LANGUAGE_MODEL_PREFIXES = ("language_model.model.", "model.language_model.")
_LANGUAGE_MODEL_HEADS = ("language_model.lm_head.weight", "lm_head.weight")


def _language_model_tensors(weight_map: dict[str, str]) -> tuple[dict, dict]:
    """({our HF name: file}, {our HF name: its name in the file}) of a multimodal
    checkpoint's language-model tensors (`model.layers.0...` for
    `language_model.model.layers.0...`)."""
    files, stored = {}, {}
    for name, file in weight_map.items():
        ours = "lm_head.weight" if name in _LANGUAGE_MODEL_HEADS else None
        for prefix in _LANGUAGE_MODEL_PREFIXES:
            if name.startswith(prefix):
                ours = "model." + name[len(prefix) :]
        if ours is not None:
            files[ours], stored[ours] = file, name
    return files, stored


def _check_tensor_names(
    path: str, specs: list[TensorSpec], weight_map: dict[str, str], cfg: ModelConfig
):
    expected = {s.hf_name for s in specs}
    missing = [s.hf_name for s in specs if s.hf_name not in weight_map]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise KeyError(
            f"tensor {missing[0]!r}{more} is missing from the safetensors files in {path!r} "
            f"(files: {sorted(set(weight_map.values()))})"
        )
    # A tied checkpoint may still store lm_head (a copy of the embedding): ignore it.
    extra = [
        n
        for n in weight_map
        if n not in expected
        and not _IGNORED.match(n)
        and not (cfg.tie_word_embeddings and n == "lm_head.weight")
    ]
    if extra:
        raise ValueError(
            f"{path!r} holds tensors this {cfg.family} config does not use: {sorted(extra)[:5]}"
            f"{' ...' if len(extra) > 5 else ''} (config.json and weights disagree?)"
        )


def _read_model_config(path: str) -> tuple[Architecture, ModelConfig]:
    """(the architecture, the ModelConfig) of a checkpoint's config.json; a bad config is a
    ModelFileError naming the file."""
    try:
        hf_config = read_config(path)
        return architecture_for(hf_config), config_from_hf(hf_config)
    except (KeyError, TypeError) as e:  # a config.json with missing or mistyped keys
        raise ModelFileError(f"{os.path.join(path, CONFIG_FILE)}: {e}") from None
    except ValueError as e:
        if isinstance(e, ModelFileError):
            raise
        msg = str(e).removeprefix(f"{CONFIG_FILE}: ")
        raise ModelFileError(f"{os.path.join(path, CONFIG_FILE)}: {msg}") from None


def _open_checkpoint(path: str, keep_mtp: bool = False):
    """(architecture, ModelConfig, {tensor name: file}, a context giving read(name) -> host
    array) of a checkpoint directory or a `.gguf` file; the tensors of its
    multi-token-prediction modules (layers past `num_hidden_layers`) only with keep_mtp."""
    if gguf_file.is_gguf(path):  # dequantized tensor by tensor, in HF's names and layout
        ckpt = gguf_file.read(path)
        arch, cfg = architecture_for(ckpt.hf_config), config_from_hf(ckpt.hf_config)
        weight_map = dict.fromkeys(ckpt.tensor_names, os.path.basename(path))
        return arch, cfg, weight_map, contextlib.nullcontext(ckpt.tensor)
    arch, cfg = _read_model_config(path)
    weight_map, stored = _weight_map(path), None
    if getattr(arch, "multimodal", False):  # its language model's tensors only
        weight_map, stored = _language_model_tensors(weight_map)
    if not keep_mtp and read_config(path).get(HF_COUNT_KEY):  # not the policy's tensors
        weight_map = {n: f for n, f in weight_map.items() if _layer_of(n) < cfg.num_layers}
    return arch, cfg, weight_map, _tensor_reader(path, weight_map, stored)


def load(
    path: str | os.PathLike,
    *,
    mesh: Mesh | None = None,
    dtype: Any = None,
    param_dtype: Any = None,
    rules=DEFAULT_RULES,
) -> Transformer:
    """A `Transformer` with the weights of an HF checkpoint directory.

    Args:
      path: directory with config.json and model.safetensors (or sharded files plus
        model.safetensors.index.json), or a `.gguf` file (models/gguf_file.py: its blocks
        dequantized to `param_dtype`).
      mesh: place parameters sharded by their logical axes on this mesh; None puts them
        on the default device.
      dtype: compute dtype ("float32" or "bfloat16"); default float32.
      param_dtype: parameter storage dtype; default float32 whatever the checkpoint holds.
      rules: logical-axis -> mesh-axis rules (`jaxrl_frontier.core.sharding.DEFAULT_RULES`).

    Returns:
      the model; `model(tokens [B, T], attention_mask [B, T])` -> logits [B, T, V].
    """
    path = os.fspath(path)
    arch, cfg, weight_map, reader = _open_checkpoint(path)
    cfg = _typed(cfg, dtype, param_dtype)
    specs = checkpoint_specs(cfg, arch.expert_tensors)
    _check_tensor_names(path, specs, weight_map, cfg)
    abstract = nnx.eval_shape(lambda: model_class(cfg)(cfg, rngs=nnx.Rngs(0)))
    with reader as read:
        return _filled(abstract, specs, read, weight_map, mesh, rules)


def load_mtp(
    path: str | os.PathLike,
    *,
    index: int = 0,
    mesh: Mesh | None = None,
    dtype: Any = None,
    param_dtype: Any = None,
    rules=DEFAULT_RULES,
) -> MultiTokenPredictor:
    """The checkpoint's multi-token-prediction module `index` (models/multi_token.py: layer
    `model.layers.{num_hidden_layers + index}`), placed and typed as `load` places the
    policy; its embedding and head are the policy's, passed at every call."""
    path = os.fspath(path)
    arch, cfg, weight_map, reader = _open_checkpoint(path, keep_mtp=True)
    count = int(read_config(path).get(HF_COUNT_KEY) or 0) if os.path.isdir(path) else 0
    if not 0 <= index < count:
        raise ModelFileError(
            f"{os.path.join(path, CONFIG_FILE)}: {HF_COUNT_KEY} = {count}: the checkpoint has "
            f"no multi-token-prediction module {index} (config key "
            "'rollout.speculative.draft' = 'mtp' needs one)"
        )
    cfg = _typed(cfg, dtype, param_dtype)
    specs = mtp_tensor_specs(cfg, cfg.num_layers + index, arch.expert_tensors)
    missing = [s.hf_name for s in specs if s.hf_name not in weight_map]
    if missing:
        raise ModelFileError(
            f"{path}: {HF_COUNT_KEY} = {count}, but tensor {missing[0]!r} of its module "
            f"{index} is missing"
        )
    abstract = nnx.eval_shape(lambda: MultiTokenPredictor(cfg, rngs=nnx.Rngs(0)))
    with reader as read:
        return _filled(abstract, specs, read, weight_map, mesh, rules)


def _typed(cfg: ModelConfig, dtype, param_dtype) -> ModelConfig:
    """The config with `load`'s compute and parameter dtypes (default float32 each)."""
    return cfg.replace(
        dtype=jnp.dtype(dtype or "float32").name,
        param_dtype=jnp.dtype(param_dtype or "float32").name,
    )


def _filled(abstract: nnx.Module, specs, read, weight_map, mesh, rules):
    """`abstract` (built by `nnx.eval_shape`) with its parameters read by `specs`: one
    parameter's tensors at a time, each device given only its own shard."""
    graphdef, state = nnx.split(abstract)
    if mesh is not None:
        shardings = dict(nnx.to_flat_state(state_shardings(state, mesh, rules)))
    variables = dict(nnx.to_flat_state(state))
    by_path: dict[tuple, list[TensorSpec]] = {}  # a stacked parameter: its L layers' specs
    for spec in specs:
        by_path.setdefault(spec.path, []).append(spec)
    default = SingleDeviceSharding(jax.devices()[0])
    pd = jnp.dtype(abstract.cfg.param_dtype)  # jnp: np.dtype does not know "bfloat16"
    # (a fused tensor is read once per parameter it fills)
    for param_path, group in by_path.items():  # one parameter's tensors at a time
        hosts = []
        for spec in group:
            w = read(spec.hf_name)
            if tuple(w.shape) != spec.hf_shape:
                raise ValueError(
                    f"tensor {spec.hf_name!r} in {weight_map[spec.hf_name]!r}: expected "
                    f"shape {spec.hf_shape} (from config.json), found {tuple(w.shape)}"
                )
            hosts.append(spec.to_ours(w))  # a view of the host array
        grid = _host_grid(group, hosts)  # [L] or [L, E] host arrays; None: unstacked
        shape = group[0].shape if grid is None else (*grid.shape, *group[0].shape)
        sharding = shardings[param_path].get_value() if mesh is not None else default

        def shard(idx, hosts=hosts, grid=grid):
            """Each device's slice, copied (and cast) from the host arrays."""
            if grid is None:
                return np.asarray(hosts[0][idx], dtype=pd)
            cells, rest = grid[idx[: grid.ndim]], idx[grid.ndim :]
            parts = [np.asarray(h[rest], dtype=pd) for h in cells.reshape(-1)]
            return np.stack(parts).reshape(*cells.shape, *parts[0].shape)

        variables[param_path].set_value(jax.make_array_from_callback(shape, sharding, shard))
        del hosts
    return nnx.merge(graphdef, state)


def _host_grid(group: list[TensorSpec], hosts: list[np.ndarray]) -> np.ndarray | None:
    """A stacked parameter's host tensors as an object array over its leading axes ([L],
    or [L, E] for experts), by each spec's `index`; None for an unstacked parameter."""
    if not group[0].index:
        return None
    dims = tuple(max(s.index[a] for s in group) + 1 for a in range(len(group[0].index)))
    grid = np.empty(dims, dtype=object)
    for spec, host in zip(group, hosts):
        grid[spec.index] = host
    return grid


# ----------------------------------------------------------------------------- writing


def _parse_size(size: int | str) -> int:
    """5_000_000, "5GB", "500MB", "10KB" -> bytes (decimal units, as transformers uses)."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"max_shard_size={size!r}; use bytes (int) or e.g. '5GB', '500MB'")
    unit = (m.group(2) or "B").upper()
    mult = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    return int(float(m.group(1)) * mult[unit])


def _shard_groups(tensors_in_order, limit: int, itemsize: int) -> list[list]:
    """The shard files' tensors, planned from shapes alone: greedy in HF tensor order, each
    file up to `limit` bytes (a larger tensor alone)."""
    groups: list[list[tuple[str, list[TensorSpec]]]] = [[]]
    used = 0
    for name, parts in tensors_in_order:
        nbytes = math.prod(parts[0].hf_shape) * itemsize
        if groups[-1] and used + nbytes > limit:
            groups.append([])
            used = 0
        groups[-1].append((name, parts))
        used += nbytes
    return groups


def _to_host(x: jax.Array) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:  # multi-host: gather
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


@jax.jit
def _layer_slice(w: jax.Array, i: jax.Array) -> jax.Array:
    """w[i] of a stacked [L, ...] parameter, w[i0, i1] for i [2] (a layer's expert): traced
    indices, one compile per shape."""
    for j in i.reshape(-1):
        w = jax.lax.dynamic_index_in_dim(w, j, 0, keepdims=False)
    return w


def save(
    model: Transformer,
    path: str | os.PathLike,
    *,
    dtype: Any = None,
    max_shard_size: int | str = "5GB",
    base_config: dict | None = None,
    mtp: MultiTokenPredictor | None = None,
) -> None:
    """Write `model` as an HF checkpoint: config.json plus model.safetensors, or
    model-0000i-of-0000n.safetensors and model.safetensors.index.json when the weights
    exceed `max_shard_size`.

    Args:
      dtype: dtype of the saved tensors (e.g. "bfloat16" for serving); default the
        parameter dtype.
      base_config: an original config.json dict whose other keys (bos/eos ids, ...) are
        kept; the architecture fields are overwritten from `model.cfg`.
      mtp: a multi-token-prediction module (`load_mtp`), written after the layers as
        DeepSeek-V3's checkpoints hold one, with its copies of the embedding and head.

    Tensors are fetched to host one shard file at a time, a layer's tensors as their slice
    of the stacked parameters. With several processes every
    process must call `save` (gathering is collective); only process 0 writes.
    """
    path = os.fspath(path)
    cfg = model.cfg
    out_dtype = np.dtype(jnp.dtype(dtype or cfg.param_dtype))
    expert_tensors = architecture_of(cfg).expert_tensors
    specs = checkpoint_specs(cfg, expert_tensors)
    variables = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    if mtp is not None:  # its parameters under ("mtp", ...), the copies from the policy
        specs = specs + _mtp_save_specs(cfg, specs, expert_tensors)
        mtp_vars = nnx.to_flat_state(nnx.state(mtp, nnx.Param))
        variables.update({("mtp", *p): v for p, v in mtp_vars})
    tensors_in_order = hf_tensors(specs)

    groups = _shard_groups(tensors_in_order, _parse_size(max_shard_size), out_dtype.itemsize)

    writer = jax.process_index() == 0
    if writer:
        os.makedirs(path, exist_ok=True)
        # Remove an earlier save's weight files so no stale shard is left next to the new ones.
        for f in os.listdir(path):
            if f in (SINGLE_FILE, INDEX_FILE) or _SHARD_RE.fullmatch(f):
                os.remove(os.path.join(path, f))

    names = (
        [SINGLE_FILE]
        if len(groups) == 1
        else [_SHARD_NAME.format(i + 1, len(groups)) for i in range(len(groups))]
    )
    weight_map, total = {}, 0
    for file, group in zip(names, groups):
        tensors = {}
        for name, parts in group:
            tensor = np.empty(parts[0].hf_shape, out_dtype)
            for spec in parts:  # the whole tensor, or each interleaved part of a fused one
                w = variables[spec.path].get_value()
                if spec.index:  # layer i's (expert e's) slice of the stacked parameter
                    w = _layer_slice(w, np.asarray(spec.index, np.int32))
                spec.write_hf(_to_host(w), tensor)
            tensors[name], weight_map[name] = tensor, file
            total += tensor.nbytes
        if writer:
            save_file(tensors, os.path.join(path, file), metadata={"format": "pt"})
        del tensors

    if not writer:
        return
    if len(groups) > 1:
        with open(os.path.join(path, INDEX_FILE), "w") as fh:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    hf = dict(base_config or {})
    # Drop the transformers-5 rope spelling of the base: ours (rope_theta/rope_scaling) wins.
    hf.pop("rope_parameters", None)
    hf.update(config_to_hf(cfg, out_dtype.name))
    hf[HF_COUNT_KEY] = int(mtp is not None)
    with open(os.path.join(path, CONFIG_FILE), "w") as fh:
        json.dump(hf, fh, indent=2, sort_keys=True)


def _mtp_save_specs(cfg: ModelConfig, specs: list[TensorSpec], expert_tensors: str):
    """The specs `save` writes an MTP module by: its own parameters' (paths under "mtp"),
    then its copies of the policy's embedding and head (`specs`: the policy's)."""
    index = cfg.num_layers
    own = [
        dataclasses.replace(spec, path=("mtp", *spec.path))
        for spec in mtp_tensor_specs(cfg, index, expert_tensors)
    ]
    by_name = {spec.hf_name: spec for spec in specs}
    embed = by_name["model.embed_tokens.weight"]
    head = embed if cfg.tie_word_embeddings else by_name["lm_head.weight"]
    names = shared_copies(index)
    return own + [dataclasses.replace(spec, hf_name=n) for spec, n in zip((embed, head), names)]


def count_params(model: Transformer) -> int:
    """Number of parameter elements of `model`."""
    return sum(
        math.prod(v.get_value().shape) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
    )


__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "TensorSpec",
    "config_from_hf",
    "config_to_hf",
    "count_params",
    "load",
    "load_mtp",
    "read_config",
    "save",
    "tensor_specs",
]
