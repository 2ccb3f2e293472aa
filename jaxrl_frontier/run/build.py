"""Builders from a config: mesh, tokenizer, models, optimizer, prompt encoding.

The only functions besides the trainer that read a ConfigDict; what they build takes plain
arguments.
"""

from __future__ import annotations

import os

import jax
import ml_collections
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.rewards.judge import JudgeRole
from jaxrl_frontier.data.rewards.reward_model import RewardModelRole
from jaxrl_frontier.data.tasks.chat import ChatTemplate
from jaxrl_frontier.models import hf, lora, moe, pretrained
from jaxrl_frontier.models.architectures import config_from_hf
from jaxrl_frontier.models.hybrid import model_class
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.model_forms import reconfigured
from jaxrl_frontier.models.multi_token import MultiTokenPredictor
from jaxrl_frontier.models.tokenizer import CharTokenizer, load_tokenizer
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.rl.learn.optimizer import build_optimizer
from jaxrl_frontier.rl.learn.train_step import init_train_state, optimizer_memory_kind
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.run.config.sections import objective_section  # noqa: F401 (users' name)
from jaxrl_frontier.sampling.rollout_section import MTP_DRAFT


def build_mesh(config) -> jax.sharding.Mesh:
    """The training (data, fsdp, tensor) mesh; see `build_meshes`."""
    return build_meshes(config)[0]


def role_devices(config) -> tuple[list, list]:
    """(train devices, rollout devices) of the run's devices (the first `mesh.num_devices`,
    0: all). `rollout.devices = N > 0` disaggregates: every process gives its last N / P
    local devices to rollouts, so each host keeps its own rows on both meshes."""
    devices = jax.devices()[: config.mesh.num_devices or None]
    n = config.rollout.devices
    if not n:
        return devices, []
    per = n // jax.process_count()
    train, rollout = [], []
    for p in range(jax.process_count()):
        local = [d for d in devices if d.process_index == p]
        train += local[: len(local) - per]
        rollout += local[len(local) - per :]
    return train, rollout


def build_meshes(config) -> tuple[jax.sharding.Mesh, jax.sharding.Mesh]:
    """(train mesh, rollout mesh): `mesh.*` over the training devices and, when
    `rollout.devices > 0`, `rollout.mesh.*` over the rollout devices (else the training
    devices). Asynchronous and partial rollouts on several processes (`rollout.max_staleness
    > 0`, `rollout.partial_budget > 0`) sample on a mesh of each process's own devices of
    those (rl/ahead.py, sampling/partial.py), of the same shape spec. A rollout mesh has no
    sequence axis (`sharding.fold_sequence`: it joins fsdp), so rows split over every device
    rather than repeating along it. `mesh.population = P > 1` (a population's members,
    docs/population.md) puts an outer 'population' axis on the train mesh, and so on the
    rollout mesh where that is the train mesh."""
    train, rollout = role_devices(config)
    population = int(config.mesh.get("population", 1))  # a population's member axis
    train_mesh = sharding.make_mesh(sharding.mesh_sizes(config.mesh), train, population)
    spec = config.rollout.mesh if rollout else config.mesh
    ahead = config.rollout.max_staleness or config.rollout.partial_budget
    if config.mode == "rl" and ahead and jax.process_count() > 1:
        own = [d for d in (rollout or train) if d.process_index == jax.process_index()]
        rollout_mesh = sharding.make_mesh(sharding.mesh_sizes(spec), own)
    elif rollout:
        rollout_mesh = sharding.make_mesh(sharding.mesh_sizes(spec), rollout)
    else:
        rollout_mesh = train_mesh
    return train_mesh, sharding.fold_sequence(rollout_mesh)


def build_tokenizer(config):
    if config.tokenizer.kind == "hf":
        return load_tokenizer(pretrained.local_path(config.tokenizer.path))
    for path in (config.tokenizer.path, export_dir(config.model.path)):
        if path and os.path.exists(os.path.join(path, "jaxrl_tokenizer.json")):
            return load_tokenizer(path)
    return CharTokenizer()


def export_dir(path: str) -> str:
    """A workdir of ours holds its HF-format export in `export/`; a pretrained model's name
    or a GGUF file is its converted directory (`models.pretrained.local_path`); any other
    path is itself."""
    path = pretrained.local_path(path)
    if path and os.path.isdir(os.path.join(path, "export")):
        return os.path.join(path, "export")
    return path


def model_config_from(config, tokenizer) -> ModelConfig:
    m = config.model
    if m.family:  # gemma2 | gemma3_text | gpt_oss | deepseek_v3 | qwen3_5: HF's mapping
        return family_config_from(m, tokenizer)
    experts = m.moe.num_experts
    family = "qwen2" if m.qkv_bias else ("qwen3" if m.qk_norm else "llama")
    return ModelConfig(
        vocab_size=m.vocab_size or tokenizer.vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim or None,
        rope_theta=m.rope_theta,
        tie_word_embeddings=m.tie_word_embeddings,
        qkv_bias=m.qkv_bias,
        qk_norm=m.qk_norm,
        max_position_embeddings=m.max_position_embeddings,
        dtype=m.dtype,
        family="qwen3_moe" if experts else family,
        remat=m.remat,
        attention=m.attention,
        scan_unroll=m.scan_unroll,
        num_experts=experts,
        num_experts_per_tok=m.moe.num_experts_per_tok if experts else 0,
        moe_intermediate_size=m.moe.intermediate_size if experts else 0,
        norm_topk_prob=m.moe.norm_topk_prob,
        moe_impl=m.moe.impl,
        moe_dispatch=m.moe.dispatch,
        moe_capacity_factor=float(m.moe.capacity_factor),
    )


def family_config_from(m, tokenizer) -> ModelConfig:
    """A scratch model of `model.family` (Gemma 2 / 3, GPT-OSS, DeepSeek-V3, Qwen3.5) via its HF
    architecture's config mapping (`models.architectures`): the section's shape written as
    that family's config.json (`_FAMILY_KEYS`), then the training choices."""
    head_dim = m.head_dim or m.hidden_size // m.num_heads
    hf_config = dict(  # the family's keys last: they may override the shape's (GPT-OSS's width)
        vocab_size=m.vocab_size or tokenizer.vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        head_dim=head_dim,
        rope_theta=m.rope_theta,
        tie_word_embeddings=m.tie_word_embeddings,
        max_position_embeddings=m.max_position_embeddings,
        sliding_window=m.sliding_window,
    )
    hf_config.update(_FAMILY_KEYS[m.family](m, head_dim))
    return config_from_hf(hf_config).replace(dtype=m.dtype, **run_choices(m))


def run_choices(m) -> dict:
    """The `model` section's choices of how a model runs, not part of its HF config: remat,
    the attention implementation, the scan's unroll, the experts' implementation."""
    return dict(
        remat=m.remat,
        attention=m.attention,
        scan_unroll=m.scan_unroll,
        moe_impl=m.moe.impl,
        moe_dispatch=m.moe.dispatch,
        moe_capacity_factor=float(m.moe.capacity_factor),
    )


def _gemma_keys(m, head_dim: int) -> dict:
    """Gemma 2 / 3's config.json keys beyond the shape: the query scale 1 / sqrt(head_dim),
    the global-layer period, Gemma 2's soft-caps."""
    gemma2 = m.family == "gemma2"
    return dict(
        architectures=["Gemma2ForCausalLM" if gemma2 else "Gemma3ForCausalLM"],
        query_pre_attn_scalar=head_dim,
        sliding_window_pattern=m.sliding_window_pattern or None,
        attn_logit_softcapping=50.0 if gemma2 else None,
        final_logit_softcapping=30.0 if gemma2 else None,
    )


def _gpt_oss_keys(m, head_dim: int) -> dict:
    """GPT-OSS's config.json keys beyond the shape: the experts (`model.moe`: an expert's
    width is GPT-OSS's intermediate_size), RoPE unscaled at `model.rope_theta` (no YaRN:
    a scratch model has no original context to extend), every pattern-th layer full (0:
    GPT-OSS's alternation, layer 0 sliding)."""
    period = m.sliding_window_pattern or 2
    return dict(
        architectures=["GptOssForCausalLM"],
        intermediate_size=m.moe.intermediate_size,
        num_local_experts=m.moe.num_experts,
        num_experts_per_tok=m.moe.num_experts_per_tok,
        rope_parameters={"rope_type": "default", "rope_theta": m.rope_theta},
        layer_types=[
            "sliding_attention" if (i + 1) % period else "full_attention"
            for i in range(m.num_layers)
        ],
    )


def _deepseek_v3_keys(m, head_dim: int) -> dict:
    """DeepSeek-V3's config.json keys beyond the shape, in its proportions (arXiv 2412.19437
    sec. 4.2: heads of 128 nope + 64 rope dims, values 128, a kv latent of 512 = 4 x 128):
    of the score width h = head_dim, qk_rope_head_dim r = 2 floor(h / 6) (a third, even),
    qk_nope_head_dim = v_head_dim = h - r, kv_lora_rank 4 (h - r); q through one q_proj
    (q_lora_rank 0, as DeepSeek-V2-Lite). The first layer dense (of `model.intermediate_size`;
    V3: 3 of 61), the rest `model.moe`'s experts plus one shared expert, gates x 2.5; E >= 8
    experts routed within the best 2 of 4 groups (V3: 4 of 8), fewer over all. RoPE
    interleaved, unscaled at `model.rope_theta`."""
    rope = 2 * (head_dim // 6)
    experts = m.moe.num_experts
    groups = 4 if experts >= 8 and experts % 4 == 0 else 1
    return dict(
        architectures=["DeepseekV3ForCausalLM"],
        qk_rope_head_dim=rope,
        qk_nope_head_dim=head_dim - rope,
        v_head_dim=head_dim - rope,
        kv_lora_rank=4 * (head_dim - rope),
        q_lora_rank=None,
        first_k_dense_replace=1,
        n_routed_experts=experts,
        n_shared_experts=1,
        num_experts_per_tok=m.moe.num_experts_per_tok,
        moe_intermediate_size=m.moe.intermediate_size,
        norm_topk_prob=m.moe.norm_topk_prob,
        n_group=groups,
        topk_group=max(1, groups // 2),
        routed_scaling_factor=2.5,
        rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": m.rope_theta},
    )


def _qwen3_5_keys(m, head_dim: int) -> dict:
    """Qwen3.5's config.json keys beyond the shape (models/qwen3_5.py): every pattern-th
    layer full (gated) attention, the others Gated DeltaNet linear attention (0: Qwen3.5's
    4, layers 3, 7, ...); a linear layer has `model.num_kv_heads` key heads and
    `model.num_heads` value heads, each of head_dim (Qwen3.5: 16 and 32 of 128); a quarter
    of an attention head rotated. With `model.moe.num_experts` > 0 the MoE
    (`Qwen3_5MoeForCausalLM`): `model.moe`'s experts plus one gated shared expert of an
    expert's width (Qwen3.5-35B-A3B: 512 and 512); else every MLP dense."""
    period = m.sliding_window_pattern or 4
    moe = bool(m.moe.num_experts)
    keys = dict(
        architectures=["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
        layer_types=[
            "linear_attention" if (i + 1) % period else "full_attention"
            for i in range(m.num_layers)
        ],
        linear_num_key_heads=m.num_kv_heads,
        linear_num_value_heads=m.num_heads,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        rope_parameters={
            "rope_type": "default", "rope_theta": m.rope_theta, "partial_rotary_factor": 0.25
        },
    )  # fmt: skip
    if moe:
        keys.update(  # an MoE has no dense MLP: intermediate_size is the experts' (as HF)
            intermediate_size=m.moe.intermediate_size,
            num_experts=m.moe.num_experts,
            num_experts_per_tok=m.moe.num_experts_per_tok,
            moe_intermediate_size=m.moe.intermediate_size,
            shared_expert_intermediate_size=m.moe.intermediate_size,
        )
    return keys


# `model.family` -> its config.json keys beyond the shape (`family_config_from`)
_FAMILY_KEYS = {
    "gemma2": _gemma_keys,
    "gemma3_text": _gemma_keys,
    "gpt_oss": _gpt_oss_keys,
    "deepseek_v3": _deepseek_v3_keys,
    "qwen3_5": _qwen3_5_keys,
}


def build_model(init: str, path: str, config, tokenizer, mesh, key, dtype: str) -> Transformer:
    """The policy (or teacher): from scratch, a Hugging Face dir, or a workdir's export."""
    if init == "scratch":
        cfg = model_config_from(config, tokenizer)
        model = model_class(cfg)(cfg, rngs=nnx.Rngs(params=jax.random.key_data(key)))
        return sharding.shard_model(model, mesh)
    model = hf.load(export_dir(path), mesh=mesh, dtype=dtype)
    return reconfigured(model, model.cfg.replace(**run_choices(config.model)))


def build_mtp_draft(config, mesh) -> MultiTokenPredictor | None:
    """The policy checkpoint's multi-token-prediction module where the rollouts draft with
    it (`rollout.speculative.draft = 'mtp'`), or None."""
    if config.rollout.speculative.draft != MTP_DRAFT:
        return None
    if config.model.init != "hf":
        raise ConfigError(
            f"config key 'rollout.speculative.draft' = {MTP_DRAFT!r} reads the module from the "
            f"policy's checkpoint: it needs model.init = 'hf' (got {config.model.init!r})"
        )
    return hf.load_mtp(export_dir(config.model.path), mesh=mesh, dtype=config.model.dtype)


def build_reward_model(config, tokenizer, mesh, key, policy_cfg) -> RewardModelRole | None:
    """The reward model (`reward_model.*`), or None: a sequence classifier from a checkpoint
    with its own tokenizer and chat template, or (init = 'random') a random one-label
    classifier of the policy's shape reading the policy's tokenizer."""
    r = config.reward_model
    if r.init == "none":
        return None
    if r.init == "random":
        cfg = policy_cfg.replace(num_labels=1, dtype=r.dtype)
        model = sharding.shard_model(model_class(cfg)(cfg, rngs=nnx.Rngs(params=key)), mesh)
        return RewardModelRole(model, tokenizer, None)
    path = pretrained.local_path(r.path)
    model = hf.load(path, mesh=mesh, dtype=r.dtype)
    if not model.cfg.num_labels:
        raise ConfigError(
            f"config key 'reward_model.path' = {r.path!r}: {path} is a causal LM, not a "
            "sequence classifier (its config.json names no *ForSequenceClassification)"
        )
    template = ChatTemplate.from_dir(path) if r.template == "chat" else None
    return RewardModelRole(model, load_tokenizer(path), template)


def build_judge(config, tokenizer, mesh, key, policy_cfg) -> JudgeRole | None:
    """The judge (`judge.*`), or None: a causal LM from a checkpoint with its own tokenizer
    and chat template, or (init = 'random') a random LM of the policy's shape reading the
    policy's tokenizer."""
    j = config.judge
    if j.init == "none":
        return None
    if j.init == "random":
        cfg = policy_cfg.replace(dtype=j.dtype)
        return JudgeRole(
            sharding.shard_model(model_class(cfg)(cfg, rngs=nnx.Rngs(params=key)), mesh),
            tokenizer,
        )
    path = pretrained.local_path(j.path)
    model = hf.load(path, mesh=mesh, dtype=j.dtype)
    if model.cfg.num_labels:
        raise ConfigError(
            f"config key 'judge.path' = {j.path!r}: {path} is a sequence classifier; a judge "
            "is a causal LM (a classifier goes in reward_model.path)"
        )
    template = ChatTemplate.from_dir(path) if j.chat else None
    return JudgeRole(model, load_tokenizer(path), template)


def attach_lora(policy: Transformer, config, mesh, key) -> Transformer:
    """The policy with LoRA adapters (`model.lora.*`, `lora.add_adapters`) placed on `mesh`
    when model.lora.rank > 0; as it is otherwise. `key`: the policy's own key (the adapters
    draw from a fold of it, so the base is the same with and without them)."""
    m = config.model
    if not m.lora.rank:
        return policy
    k_lora = jax.random.fold_in(key, 1)
    lora.add_adapters(
        policy, rank=m.lora.rank, alpha=m.lora.alpha, targets=m.lora.targets, key=k_lora
    )
    return sharding.shard_model(policy, mesh)  # the adapters by their logical axes


def build_teacher(config, tokenizer, mesh, key, policy_cfg, path=None) -> Transformer | None:
    """The teacher (`teacher.*`; `path`: another checkpoint than `teacher.path`, one of
    `teacher.by_tag`'s), or None; it must share the policy's vocabulary."""
    t = config.teacher
    if t.init == "none":
        return None
    teacher = build_model(t.init, path or t.path, config, tokenizer, mesh, key, t.dtype)
    if t.tokenizer == "policy" and teacher.cfg.vocab_size != policy_cfg.vocab_size:
        raise ConfigError(
            f"teacher vocab {teacher.cfg.vocab_size} != policy vocab {policy_cfg.vocab_size}: "
            "teacher and student must share a tokenizer (or set teacher.tokenizer = 'own')"
        )
    return teacher


def teacher_tokenizer(config):
    """The teacher's own tokenizer (`teacher.tokenizer = 'own'`: its checkpoint's), or None
    when it reads the student's tokens."""
    t = config.teacher
    return load_tokenizer(export_dir(t.path)) if t.tokenizer == "own" else None


def build_tagged_teachers(config, tokenizer, mesh, key, policy_cfg) -> tuple[tuple, dict]:
    """Several teachers (`teacher.by_tag`): (the teachers beyond `teacher.path`'s, each
    checkpoint loaded once, in order of first mention by sorted tag; {tag: its teacher's
    index}, 0 the teacher at `teacher.path`, which also serves every tag not listed)."""
    t, paths, index = config.teacher, [], {}
    for tag, path in sorted(t.by_tag.items()):
        if path != t.path and path not in paths:
            paths.append(path)
        index[str(tag)] = 0 if path == t.path else 1 + paths.index(path)
    build = lambda p: build_teacher(config, tokenizer, mesh, key, policy_cfg, path=p)  # noqa: E731
    return tuple(build(p) for p in paths), index


def build_train_state(c, mesh, params, key) -> tuple:
    """(tx, state, its shardings): the optimizer of config `c` over its total updates and the
    train state of `params` placed on `mesh` (the optimizer state in host memory with
    `train.offload_optimizer`). An MoE router's balancing bias (DeepSeek-V3) is left out of
    the optimizer: the update moves it by its own rule (`moe.balance_biases`)."""
    fixed = moe.is_balance_bias if moe.has_balance_bias(params) else None
    tx = build_optimizer(sections.optimizer_section(c), total_updates(c), fixed=fixed)
    offload = optimizer_memory_kind(c.train.offload_optimizer, mesh)
    state = init_train_state(tx, params, mesh, key, memory_kind=offload)
    return tx, state, jax.tree.map(lambda x: x.sharding, state)


def total_updates(config) -> int:
    """Optimizer steps of the whole run (the schedule's horizon): in RL, train.epochs x
    train.minibatches a step, as each stage sets them (run/config/stages.py)."""
    from jaxrl_frontier.run.config import stages

    c = config
    return stages.updates_over(c, stages.parse(c)) if c.mode == "rl" else c.train.steps


# The keys that fix the learning-rate schedule: a resume must not silently change them.
SCHEDULE_KEYS = ("optimizer.lr", "optimizer.schedule", "optimizer.warmup_steps")


def check_resume_schedule(saved: dict, config) -> None:
    """Refuse a resume whose learning-rate schedule differs from the checkpoint's (`saved`:
    the checkpointed config): the optimizer's step count would follow another curve without
    a word. A decaying schedule's horizon (train.steps x epochs x minibatches) counts too."""
    if not saved.get("optimizer") or not saved.get("train"):
        return
    now = config.to_dict()
    get = lambda d, key: d[key.split(".")[0]].get(key.split(".")[1])
    changed = [k for k in SCHEDULE_KEYS if get(saved, k) != get(now, k)]
    if now["optimizer"]["schedule"] != "constant":
        before = total_updates(ml_collections.ConfigDict(saved))
        if before != total_updates(config):
            changed.append(
                f"train.steps x epochs x minibatches ({before} -> {total_updates(config)} "
                "optimizer steps, the decay's horizon)"
            )
    if changed:
        raise ConfigError(
            f"resuming with another learning-rate schedule than the checkpoint's: "
            f"{', '.join(changed)} changed. A schedule is fixed by the run that started it: "
            "restore those keys, or start a new workdir from this one's export "
            "(model.init='checkpoint')"
        )
