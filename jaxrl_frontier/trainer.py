"""The trainer: SFT warm start and the RL loop, the one place that holds state.

One RL step (DESIGN.md's data flow):

    prompts [P]  --sampler-->  Rollout [P*G, Tp+Tn]  --task.reward-->  R [P, G, K]
    Rollout --jitted forwards--> ref / teacher log-probs [B, T]
    R --advantage registry (vmapped over prompts)--> A [P, G] -> per token [B, T]
    epochs x minibatches of the jitted, sharded, donated train step:
        loss_fn(params, batch, objective cfg) -> optax update
    metrics -> TensorBoard + JSONL + console;  state -> orbax checkpoint

Sections below: setup (mesh, tokenizer, task, models, optimizer), jitted steps, restore,
the loops, evaluation. A run resumes whenever its workdir already holds a checkpoint;
SIGTERM/SIGINT save one and return.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from jaxrl_frontier import config as config_lib
from jaxrl_frontier import sharding
from jaxrl_frontier.checkpoint import Checkpointer, StopRequest, abstract_like
from jaxrl_frontier.metrics import MetricsWriter, ProgressBar, RolloutLogger
from jaxrl_frontier.models import hf
from jaxrl_frontier.models.tokenizer import CharTokenizer, load_tokenizer
from jaxrl_frontier.models.transformer import ModelConfig, Transformer
from jaxrl_frontier.objectives import advantages as adv_lib
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.rewards import score_completions
from jaxrl_frontier.sampling import Sampler, SamplingParams
from jaxrl_frontier.tasks import eval_examples, make_prompt_iterator, make_task

log = logging.getLogger(__name__)


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training (a pytree; checkpointed whole)."""

    params: Any  # nnx.State of the policy
    opt_state: Any
    step: jax.Array  # int32 [], completed updates of the outer loop
    rng: jax.Array  # uint32 key data
    skipped: jax.Array  # int32 [], updates skipped for non-finite loss/grads


# ============================================================================ setup


def build_tokenizer(config):
    if config.tokenizer.kind == "hf":
        return load_tokenizer(config.tokenizer.path)
    for path in (config.tokenizer.path, _export_dir(config.model.path)):
        if path and os.path.exists(os.path.join(path, "jaxrl_tokenizer.json")):
            return load_tokenizer(path)
    return CharTokenizer()


def _export_dir(path: str) -> str:
    """A workdir of ours holds its HF-format export in `export/`; any other path is itself."""
    if path and os.path.isdir(os.path.join(path, "export")):
        return os.path.join(path, "export")
    return path


def model_config_from(config, tokenizer) -> ModelConfig:
    m = config.model
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
        family="qwen2" if m.qkv_bias else ("qwen3" if m.qk_norm else "llama"),
        remat=m.remat,
    )


def build_model(init: str, path: str, config, tokenizer, mesh, key, dtype: str) -> Transformer:
    """The policy (or teacher): from scratch, a Hugging Face dir, or a workdir's export."""
    if init == "scratch":
        model = Transformer(
            model_config_from(config, tokenizer), rngs=nnx.Rngs(params=jax.random.key_data(key))
        )
        return sharding.shard_model(model, mesh)
    model = hf.load(_export_dir(path), mesh=mesh, dtype=dtype)
    if config.model.remat:  # a training choice, not part of the HF config
        model.cfg = model.cfg.replace(remat=True)
    return model


def build_optimizer(opt_cfg, total_updates: int) -> optax.GradientTransformation:
    warmup = opt_cfg.warmup_steps
    decay_steps = max(total_updates - warmup, 1)
    decay = {
        "constant": optax.constant_schedule(opt_cfg.lr),
        "cosine": optax.cosine_decay_schedule(opt_cfg.lr, decay_steps),
        "linear": optax.linear_schedule(opt_cfg.lr, 0.0, decay_steps),
    }[opt_cfg.schedule]
    schedule = (
        optax.join_schedules([optax.linear_schedule(0.0, opt_cfg.lr, warmup), decay], [warmup])
        if warmup
        else decay
    )
    return optax.chain(
        optax.clip_by_global_norm(opt_cfg.max_grad_norm),
        optax.adamw(
            schedule,
            b1=opt_cfg.b1,
            b2=opt_cfg.b2,
            eps=opt_cfg.eps,
            weight_decay=opt_cfg.weight_decay,
        ),
    )


def encode_prompts(tokenizer, texts: list[str], max_len: int):
    """Left-padded int32 [N, max_len] prompts and their mask."""
    tokens, mask = tokenizer.batch_encode(texts, max_len=max_len, add_bos=True)
    pad = max_len - tokens.shape[1]
    if pad > 0:
        tokens = np.pad(tokens, ((0, 0), (pad, 0)), constant_values=tokenizer.pad_id)
        mask = np.pad(mask, ((0, 0), (pad, 0)))
    return tokens.astype(np.int32), mask.astype(np.int32)


def encode_demonstrations(tokenizer, prompts, completions, max_prompt_len, max_new_tokens):
    """SFT batch in the rollout layout: [left-padded prompt | completion + EOS, right-padded].

    Returns dict(tokens, attention_mask, loss_mask) [N, Tp + Tn]; loss on completion + EOS.
    """
    p_tok, p_mask = encode_prompts(tokenizer, prompts, max_prompt_len)
    n, tn = len(completions), max_new_tokens
    c_tok = np.full((n, tn), tokenizer.pad_id, np.int32)
    c_mask = np.zeros((n, tn), np.int32)
    for i, text in enumerate(completions):
        ids = tokenizer.encode(text) + [tokenizer.eos_id]
        if len(ids) > tn:
            raise ValueError(
                f"demonstration {text!r} is {len(ids)} tokens with EOS; "
                f"rollout.max_new_tokens={tn} is too small"
            )
        c_tok[i, : len(ids)] = ids
        c_mask[i, : len(ids)] = 1
    return dict(
        tokens=np.concatenate([p_tok, c_tok], 1),
        attention_mask=np.concatenate([p_mask, c_mask], 1),
        loss_mask=np.concatenate([np.zeros_like(p_mask), c_mask], 1).astype(np.float32),
    )


def init_opt_state(tx: optax.GradientTransformation, params, mesh):
    """`tx.init(params)` with every parameter-shaped leaf (Adam's mu, nu) sharded like its
    parameter (FSDP shards the optimizer state too) and the rest (step counts) replicated.

    A plain `jax.jit(tx.init)` puts its zeros on the default device: replicating them would
    keep a full optimizer state on every device. Every leaf gets a NamedSharding on `mesh`
    (also on one device), so the update's output state has the input's types and the update
    compiles once.
    """
    abstract = jax.eval_shape(tx.init, params)
    out_shardings = optax.tree_map_params(
        tx,
        lambda _, s: s,
        abstract,
        jax.tree.map(lambda x: x.sharding, params),
        transform_non_params=lambda _: sharding.replicated(mesh),
    )
    return jax.jit(tx.init, out_shardings=out_shardings)(params)


# ============================================================================ jitted steps


def _apply_hidden(graphdef, group_size: int = 1, completion_len: int = 0):
    """(params, tokens, mask) -> (final hidden [B, T, D], output layer [D, V]).

    group_size > 1 and completion_len > 0: the rows are prompt-major groups of `group_size`
    that share their first T - completion_len tokens (an RL batch), and each group's prompt
    runs through the model once (`Transformer.hidden_states_shared_prompt`; same values).
    """
    shared = group_size > 1 and completion_len > 0

    def apply_hidden_fn(params, tokens, attention_mask):
        model = nnx.merge(graphdef, params)
        if shared:
            hidden = model.hidden_states_shared_prompt(
                tokens,
                attention_mask,
                prompt_len=tokens.shape[1] - completion_len,
                group_size=group_size,
            )
        else:
            hidden = model.hidden_states(tokens, attention_mask)[0]
        return hidden, model.output_embedding()

    return apply_hidden_fn


def _apply(graphdef, group_size: int = 1, completion_len: int = 0):
    """(params, tokens, mask) -> logits [B, T, V] (f32); groups as in `_apply_hidden`."""
    apply_hidden_fn = _apply_hidden(graphdef, group_size, completion_len)

    def apply_fn(params, tokens, attention_mask):
        hidden, _ = apply_hidden_fn(params, tokens, attention_mask)
        return nnx.merge(graphdef, params).logits(hidden)

    return apply_fn


def _first_scored(tokens, completion_len: int) -> int:
    """First position whose log-prob is computed: the completion's (the loss mask is 0
    on the prompt), or 1 (every position) when the completion length is not given."""
    return tokens.shape[1] - completion_len if completion_len else 1


def make_logp_fn(
    graphdef,
    logprob_chunk: int | None = losses.DEFAULT_LOGPROB_CHUNK,
    *,
    group_size: int = 1,
    completion_len: int = 0,
):
    """Jitted (params, tokens, mask) -> per-token log-probs [B, T] aligned with tokens.

    logprob_chunk: positions per chunk of the fused output layer + log-softmax (no
    [B, T, V] logits); None: the plain path through the full logits.
    completion_len > 0: only the last `completion_len` positions are scored (the rest are
    0), and with group_size > 1 each group's prompt runs once (see `_apply_hidden`).
    """
    apply_fn = _apply(graphdef, group_size, completion_len)
    apply_hidden_fn = _apply_hidden(graphdef, group_size, completion_len)

    @jax.jit
    def logp_fn(params, tokens, attention_mask):
        start = _first_scored(tokens, completion_len)
        if logprob_chunk is None:
            logp = losses.token_logprobs(apply_fn(params, tokens, attention_mask), tokens)
            return jnp.where(jnp.arange(tokens.shape[1]) >= start, logp, 0.0)
        hidden, w_out = apply_hidden_fn(params, tokens, attention_mask)
        return losses.token_logprobs_from_hidden(hidden, w_out, tokens, logprob_chunk, start)

    return logp_fn


def _microbatch_grads(loss_of, params, batch, grad_accum: int):
    """Mean loss, grads and metrics over `grad_accum` microbatches (lax.scan, one compile)."""
    if grad_accum == 1:
        (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(params, batch)
        return loss, grads, metrics
    micro = jax.tree.map(lambda x: x.reshape(grad_accum, -1, *x.shape[1:]), batch)

    def body(carry, mb):
        (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(params, mb)
        acc_loss, acc_grads, acc_metrics = carry
        carry = (
            acc_loss + loss / grad_accum,
            jax.tree.map(lambda a, g: a + g / grad_accum, acc_grads, grads),
            jax.tree.map(lambda a, m: a + m / grad_accum, acc_metrics, metrics),
        )
        return carry, None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (_, m0), _ = jax.eval_shape(lambda: jax.value_and_grad(loss_of, has_aux=True)(params, batch))
    zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m0)
    (loss, grads, metrics), _ = jax.lax.scan(body, (0.0, zeros, zero_metrics), micro)
    return loss, grads, metrics


def make_update_fn(graphdef, tx, loss_of, grad_accum: int, state_sharding, batch_sharding_tree):
    """Jitted `update(state, batch) -> (state, metrics)`; donates the old state.

    A non-finite loss or gradient skips the update (params and optimizer state unchanged)
    and counts it in `state.skipped`, so one bad batch does not end a long run.
    """

    def update(state: TrainState, batch):
        loss, grads, metrics = _microbatch_grads(loss_of, state.params, batch, grad_accum)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        state = state.replace(
            params=keep(new_params, state.params),
            opt_state=keep(new_opt, state.opt_state),
            skipped=state.skipped + (~finite).astype(jnp.int32),
        )
        metrics = dict(metrics, loss=loss, grad_norm=grad_norm, update_skipped=1.0 - finite)
        return state, metrics

    return jax.jit(
        update,
        in_shardings=(state_sharding, batch_sharding_tree),
        out_shardings=(state_sharding, None),
        donate_argnums=(0,),
    )


def sft_loss(graphdef, logprob_chunk: int | None = losses.DEFAULT_LOGPROB_CHUNK):
    """Token-mean cross-entropy on completion tokens (the loss_mask).

    logprob_chunk: as in `make_logp_fn` (None: through the full [B, T, V] logits).
    """
    apply_fn, apply_hidden_fn = _apply(graphdef), _apply_hidden(graphdef)

    def loss_of(params, batch):
        if logprob_chunk is None:
            logits = apply_fn(params, batch["tokens"], batch["attention_mask"])
            logp = losses.token_logprobs(logits, batch["tokens"])
        else:
            hidden, w_out = apply_hidden_fn(params, batch["tokens"], batch["attention_mask"])
            logp = losses.token_logprobs_from_hidden(hidden, w_out, batch["tokens"], logprob_chunk)
        m = batch["loss_mask"]
        nll = -jnp.sum(logp * m) / jnp.maximum(jnp.sum(m), 1.0)
        return nll, dict(nll=nll)

    return loss_of


def objective_section(objective) -> dict:
    """The keys of `config.objective` the loss reads ('' distill -> None)."""
    out = {k: v for k, v in objective.to_dict().items() if k in losses.DEFAULTS}
    out["distill"] = out.get("distill") or None
    return out


def rl_loss(
    graphdef,
    objective_cfg,
    logprob_chunk: int | None = losses.DEFAULT_LOGPROB_CHUNK,
    *,
    group_size: int = 1,
    completion_len: int = 0,
):
    """`losses.loss_fn` over the policy; with `logprob_chunk` (the default) the log-probs
    come from the fused, chunked output layer unless a distillation loss needs logits.

    completion_len > 0: log-probs only over the last `completion_len` positions (the loss
    mask is 0 on the prompt); with group_size > 1 each group's prompt runs once
    (`_apply_hidden`). Both need prompt-major groups of [prompt | completion] rows.
    """
    apply_fn = _apply(graphdef, group_size, completion_len)
    apply_hidden_fn = None
    if logprob_chunk is not None:
        apply_hidden_fn = _apply_hidden(graphdef, group_size, completion_len)

    def loss_of(params, batch):
        return losses.loss_fn(
            params,
            batch,
            objective_cfg,
            apply_fn=apply_fn,
            apply_hidden_fn=apply_hidden_fn,
            logprob_chunk=logprob_chunk or losses.DEFAULT_LOGPROB_CHUNK,
            first_scored=_first_scored(batch["tokens"], completion_len),
        )

    return loss_of


# ============================================================================ the trainer


class Trainer:
    """Builds everything from a config and runs SFT or RL; `run()` returns a summary dict."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str | None = None):
        config = config_lib.resolve(config)
        if workdir:
            config.workdir = workdir
        if not config.workdir:
            raise config_lib.ConfigError("config key 'workdir' is empty: pass --workdir")
        config_lib.validate(config, num_devices=jax.device_count())
        self.config = c = config
        self.workdir = os.path.abspath(c.workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.is_main = jax.process_index() == 0

        # ---- mesh, tokenizer, task
        devices = jax.devices()[: c.mesh.num_devices or None]
        self.mesh = sharding.make_mesh([c.mesh[a] for a in sharding.MESH_AXES], devices)
        self.tokenizer = build_tokenizer(c)
        self.task = make_task(c.task.name, **c.task.kwargs.to_dict())
        self.reward_names = list(self.task.reward_names)

        # ---- models: policy (trained), reference (frozen copy of the start), teacher
        root = jax.random.key(c.seed)
        k_model, k_teacher, self._rng0 = jax.random.split(root, 3)
        self.policy = build_model(
            c.model.init, c.model.path, c, self.tokenizer, self.mesh, k_model, c.model.dtype
        )
        self.graphdef, params = nnx.split(self.policy)
        self.param_sharding = sharding.state_shardings(params, self.mesh)
        self.ref_params = None
        if c.mode == "rl" and self._needs_reference():
            self.ref_params = jax.tree.map(jnp.copy, params)
        self.teacher = None
        if c.teacher.init != "none":
            self.teacher = build_model(
                c.teacher.init,
                c.teacher.path,
                c,
                self.tokenizer,
                self.mesh,
                k_teacher,
                c.teacher.dtype,
            )
            if self.teacher.cfg.vocab_size != self.policy.cfg.vocab_size:
                raise config_lib.ConfigError(
                    f"teacher vocab {self.teacher.cfg.vocab_size} != policy vocab "
                    f"{self.policy.cfg.vocab_size}: teacher and student must share a tokenizer"
                )
            teacher_graphdef, self.teacher_params = nnx.split(self.teacher)
            self.teacher_logp_fn = make_logp_fn(teacher_graphdef, **self._rollout_layout())
        self.logp_fn = make_logp_fn(self.graphdef, **self._rollout_layout())

        # ---- optimizer and state
        total_updates = c.train.steps * (
            c.train.epochs * c.train.minibatches if c.mode == "rl" else 1
        )
        self.tx = build_optimizer(c.optimizer, total_updates)
        self.state = self._init_state(params)
        self.state_sharding = jax.tree.map(lambda x: x.sharding, self.state)

        # ---- checkpointing, logging
        self.ckpt = Checkpointer(
            os.path.join(self.workdir, "checkpoints"), max_to_keep=c.train.keep_checkpoints
        )
        self.writer = MetricsWriter(self.workdir)
        self.rollout_log = RolloutLogger(self.workdir) if self.is_main else None
        self.history: dict[str, Any] = {"eval": []}
        if self.is_main:
            with open(os.path.join(self.workdir, "config.json"), "w") as f:
                f.write(c.to_json_best_effort(indent=2))

    # ------------------------------------------------------------------ helpers

    def _needs_reference(self) -> bool:
        o = self.config.objective
        return o.kl_coef > 0 or o.advantage == "progress"

    def _rollout_layout(self, rows: int | None = None) -> dict[str, int]:
        """How an RL batch of `rows` rows (default: a whole step's) may be run: its last
        `completion_len` positions are the only ones scored, and with group_size > 1 each
        group's prompt runs once (`train.share_prompt_forward`), when `rows` holds whole
        groups that split evenly over the batch's devices (otherwise the packed prompt and
        completion rows would be resharded in every layer). Keyword arguments of
        `make_logp_fn` and `rl_loss`."""
        c = self.config
        if c.mode != "rl":
            return {}
        n = c.rollout.group_size
        rows = c.data.prompt_batch * n if rows is None else rows
        groups, rem = divmod(rows, n)
        share = c.train.share_prompt_forward and n > 1 and not rem
        share = share and groups % sharding.batch_size_multiple(self.mesh) == 0
        return dict(group_size=n if share else 1, completion_len=c.rollout.max_new_tokens)

    def _micro_rows(self) -> int:
        """Rows of one microbatch of the RL update."""
        c = self.config
        rows = c.data.prompt_batch * c.rollout.group_size
        return rows // (c.train.minibatches * c.optimizer.grad_accum)

    def make_rl_update(self, batch_keys):
        """The jitted RL update over a minibatch dict with `batch_keys` ([rows, T] each)."""
        c = self.config
        layout = self._rollout_layout(self._micro_rows())
        if c.train.share_prompt_forward and layout["group_size"] == 1:
            self._print(
                f"[rl] train.share_prompt_forward is off for the update: a microbatch of "
                f"{self._micro_rows()} rows is not whole groups of {c.rollout.group_size} that "
                f"split evenly over the {sharding.batch_size_multiple(self.mesh)} batch devices"
            )
        return make_update_fn(
            self.graphdef,
            self.tx,
            rl_loss(self.graphdef, objective_section(c.objective), **layout),
            c.optimizer.grad_accum,
            self.state_sharding,
            {k: sharding.batch_sharding(self.mesh, 2) for k in batch_keys},
        )

    def _minibatch_order(self, rows: int, update_groups: int) -> np.ndarray:
        """A random order of the step's rows; whole groups stay together (and in order)
        when the update runs each group's prompt once."""
        perm = np.asarray(jax.random.permutation(self._next_key(), rows // update_groups))
        return (perm[:, None] * update_groups + np.arange(update_groups)).reshape(-1)

    def _init_state(self, params) -> TrainState:
        repl = sharding.replicated(self.mesh)
        opt_state = init_opt_state(self.tx, params, self.mesh)
        return TrainState(
            params=params,
            opt_state=opt_state,
            step=jax.device_put(jnp.zeros((), jnp.int32), repl),
            rng=jax.device_put(jax.random.key_data(self._rng0), repl),
            skipped=jax.device_put(jnp.zeros((), jnp.int32), repl),
        )

    def _next_key(self):
        """Split the state's RNG (kept in the checkpoint, so a resume continues the stream)."""
        rng, key = jax.random.split(jax.random.wrap_key_data(self.state.rng))
        self.state = self.state.replace(rng=jax.random.key_data(rng))
        return key

    def _save(self, data_state: dict | None) -> None:
        step = int(self.state.step)
        meta = dict(data=data_state, history=self.history, config=self.config.to_dict())
        self.ckpt.save(step, self.state, meta)

    def _restore(self) -> dict | None:
        """Resume from the latest checkpoint in the workdir, if any; returns its metadata."""
        if self.ckpt.latest_step() is None:
            return None
        state, meta = self.ckpt.restore(abstract_like(self.state))
        self.state = state
        self.history = meta.get("history") or {"eval": []}
        log.info("resumed from %s at step %d", self.ckpt.directory, int(state.step))
        return meta

    def _print(self, msg: str) -> None:
        if self.is_main:
            print(msg, flush=True)

    def export(self, path: str | None = None) -> str:
        """Write the current policy in Hugging Face format (+ tokenizer) to workdir/export."""
        path = path or os.path.join(self.workdir, "export")
        nnx.update(self.policy, self.state.params)
        if self.is_main:
            hf.save(self.policy, path)
            self.tokenizer.save(path)
        return path

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, num_prompts: int | None = None) -> dict[str, float]:
        """Held-out greedy pass@1 and sampled pass@k (k = eval.pass_k, temperature 1)."""
        c = self.config
        # at most the held-out split (a small local JSONL may hold only a few eval rows)
        n = min(num_prompts or c.eval.num_prompts, self.task.num_examples("eval"))
        examples = eval_examples(self.task, n, c.seed)
        nnx.update(self.policy, self.state.params)
        greedy = self._solve_rate(
            examples,
            SamplingParams(
                greedy=True,
                n=1,
                max_new_tokens=c.rollout.max_new_tokens,
                eos_ids=(self.tokenizer.eos_id,),
            ),
            jax.random.key(0),
        )
        out = {"eval/pass@1_greedy": float(np.mean(greedy))}
        if c.eval.pass_k > 1:
            k = c.eval.pass_k
            sampled = self._solve_rate(
                examples,
                SamplingParams(
                    temperature=1.0,
                    n=k,
                    max_new_tokens=c.rollout.max_new_tokens,
                    eos_ids=(self.tokenizer.eos_id,),
                ),
                jax.random.key(1),
            )
            per_prompt = sampled.reshape(len(examples), k)
            out[f"eval/pass@{k}"] = float(per_prompt.max(1).mean())
            out["eval/mean_correct_sampled"] = float(per_prompt.mean())
        return out

    def _solve_rate(self, examples, params: SamplingParams, key) -> np.ndarray:
        c = self.config
        correct = []
        bs = c.eval.batch
        for i in range(0, len(examples), bs):
            chunk = examples[i : i + bs]
            tok, mask = encode_prompts(
                self.tokenizer, [self.task.prompt(e) for e in chunk], c.data.max_prompt_len
            )
            key, sub = jax.random.split(key)
            ro = self.sampler.generate(tok, mask, params, sub)
            texts = self._decode(ro)
            reps = [e for e in chunk for _ in range(params.n)]
            r, _ = score_completions(self.task, reps, texts)
            correct.append(r[:, self.reward_names.index("correctness")])
        return np.concatenate(correct)

    def _decode(self, rollout) -> list[str]:
        toks = np.asarray(rollout.completion_tokens)
        mask = np.asarray(rollout.completion_mask)
        return [
            self.tokenizer.decode(t[m.astype(bool)].tolist(), skip_special=True, stop_at_eos=True)
            for t, m in zip(toks, mask)
        ]

    @property
    def sampler(self) -> Sampler:
        if not hasattr(self, "_sampler"):
            self._sampler = Sampler(
                self.policy,
                pad_id=self.tokenizer.pad_id,
                mesh=self.mesh,
                cache_dtype=self.config.rollout.cache_dtype or None,
                decode_attention=self.config.rollout.decode_attention,
                decode_matmul=self.config.rollout.decode_matmul,
                cast_weights_once=self.config.rollout.cast_weights_once,
            )
        return self._sampler

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any]:
        stop = StopRequest()
        try:
            if self.config.mode == "sft":
                return self._run_sft(stop)
            return self._run_rl(stop)
        finally:
            stop.restore()
            self.ckpt.wait()
            self.writer.flush()

    def _end_of_step(self, done: int, data, stop: StopRequest, tag: str) -> str | None:
        """Eval, checkpoint and stop handling after update `done`.

        Returns None to go on, "signal" after SIGTERM/SIGINT (checkpoint saved), or "target"
        when held-out greedy pass@1 reached `train.stop_at_pass1` (checkpoint saved; the
        history records it, so running the same command again does not train further).
        """
        c = self.config
        outcome = "signal" if stop.requested else None
        if done % c.train.eval_every == 0 or done == c.train.steps:
            ev = self.evaluate()
            self.history["eval"].append(dict(step=done, **ev))
            self.writer.write_scalars(done, ev)
            self._print(f"[{tag}] step {done}: " + _fmt(ev))
            target = c.train.stop_at_pass1
            if target > 0 and ev["eval/pass@1_greedy"] >= target and outcome is None:
                self.history["target_reached_at"] = done
                self._print(f"[{tag}] pass@1 reached train.stop_at_pass1={target}: done")
                outcome = "target"
        if done % c.train.checkpoint_every == 0 or done == c.train.steps or outcome:
            self._save(_encode_state(data.get_state()))
        if outcome == "signal":
            self._print(f"[{tag}] stopped by {stop.signal_name} at step {done}; checkpoint saved")
        return outcome

    def _steps_left(self, start: int) -> range:
        """The updates still to run (none once a stop_at_pass1 target was reached)."""
        if "target_reached_at" in self.history:
            return range(0)
        return range(start, self.config.train.steps)

    def _finish(self, bar) -> dict[str, Any]:
        """Close the progress bar, let the last save land, export the policy."""
        if bar:
            bar.close()
        self.ckpt.wait()
        self.export()
        return dict(stopped=False, step=int(self.state.step), history=self.history)

    # ---- SFT warm start ----------------------------------------------------------

    def _run_sft(self, stop: StopRequest) -> dict[str, Any]:
        c = self.config
        batch_sh = sharding.batch_sharding(self.mesh, 2)
        update = make_update_fn(
            self.graphdef,
            self.tx,
            sft_loss(self.graphdef),
            c.optimizer.grad_accum,
            self.state_sharding,
            batch_sh,
        )
        data = make_prompt_iterator(
            self.task, split="train", batch_size=c.train.sft_batch, seed=c.seed
        )
        meta = self._restore()
        if meta and meta.get("data") is not None:
            data.set_state(_decode_state(meta["data"]))
        start = int(self.state.step)
        if start == 0 and self.is_main:
            self._print(
                f"[sft] {self.policy.cfg.num_params() / 1e6:.2f}M params, "
                f"{c.train.steps} steps of {c.train.sft_batch} demonstrations"
            )
        bar = ProgressBar(c.train.steps, initial=start, desc="sft") if self.is_main else None
        metrics = {}
        for step in self._steps_left(start):
            examples = _rows(next(data))
            batch = encode_demonstrations(
                self.tokenizer,
                [self.task.prompt(e) for e in examples],
                [self.task.demonstration(e) for e in examples],
                c.data.max_prompt_len,
                c.rollout.max_new_tokens,
            )
            self.state, metrics = update(self.state, sharding.shard_batch(batch, self.mesh))
            self.state = self.state.replace(step=self.state.step + 1)
            done = step + 1
            if done % c.train.log_every == 0 or done == c.train.steps:
                scalars = {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items()}
                self.writer.write_scalars(done, scalars)
                if bar:
                    bar.update(done, {"nll": scalars["train/nll"]})
            outcome = self._end_of_step(done, data, stop, "sft")
            if outcome == "signal":
                return dict(stopped=True, step=done, history=self.history)
            if outcome == "target":
                break
        return self._finish(bar)

    # ---- RL ---------------------------------------------------------------------

    def _rl_batch(self, examples, key):
        """Rollouts, rewards, reference/teacher log-probs and advantages: one device batch."""
        c, o = self.config, self.config.objective
        p, g = len(examples), c.rollout.group_size
        prompt_tok, prompt_mask = encode_prompts(
            self.tokenizer, [self.task.prompt(e) for e in examples], c.data.max_prompt_len
        )
        nnx.update(self.policy, self.state.params)
        key_sample, key_dropout = jax.random.split(key)
        t0 = time.perf_counter()
        rollout = self.sampler.generate(
            prompt_tok,
            prompt_mask,
            SamplingParams(
                temperature=c.rollout.temperature,
                top_k=c.rollout.top_k,
                top_p=c.rollout.top_p,
                min_p=c.rollout.min_p,
                n=g,
                max_new_tokens=c.rollout.max_new_tokens,
                eos_ids=(self.tokenizer.eos_id,),
                dropout_rate=c.rollout.dropout_rate,
            ),
            key_sample,
        )
        texts = self._decode(rollout)
        t_rollout = time.perf_counter() - t0
        reps = [e for e in examples for _ in range(g)]
        rewards, n_failed = score_completions(self.task, reps, texts)  # [P*G, K]
        seq = rollout.sequences()
        batch = dict(
            tokens=seq.tokens,
            attention_mask=seq.attention_mask,
            loss_mask=seq.loss_mask,
            old_logp=seq.old_logp,
        )
        if c.train.recompute_old_logp:
            batch["old_logp"] = (
                self.logp_fn(self.state.params, batch["tokens"], batch["attention_mask"])
                * batch["loss_mask"]
            )
        if self.ref_params is not None:
            batch["ref_logp"] = (
                self.logp_fn(self.ref_params, batch["tokens"], batch["attention_mask"])
                * batch["loss_mask"]
            )
        if self.teacher is not None:
            batch["teacher_logp"] = (
                self.teacher_logp_fn(self.teacher_params, batch["tokens"], batch["attention_mask"])
                * batch["loss_mask"]
            )

        # ---- advantages
        r_pgk = jnp.asarray(rewards.reshape(p, g, -1))
        r_pg = self._combine_rewards(r_pgk)
        if o.kl_in_reward and "ref_logp" in batch:
            kl_seq = jnp.sum((batch["old_logp"] - batch["ref_logp"]) * batch["loss_mask"], -1)
            r_pg = r_pg - o.kl_coef * kl_seq.reshape(p, g)
        batch["advantages"] = self._advantages(r_pg, r_pgk, batch)
        info = dict(
            rewards=rewards,
            texts=texts,
            n_failed=n_failed,
            t_rollout=t_rollout,
            zero_var_groups=int(adv_lib.zero_variance_groups(r_pg)),
            lengths=np.asarray(rollout.lengths),
            r_pg=np.asarray(r_pg),
        )
        if "teacher_logp" in batch:  # sampled-token reverse KL(student || teacher), per token
            m = np.asarray(batch["loss_mask"])
            gap = np.asarray(batch["old_logp"]) - np.asarray(batch["teacher_logp"])
            info["reverse_kl"] = float((gap * m).sum() / max(m.sum(), 1.0))
        return batch, info

    def _combine_rewards(self, r_pgk):
        weights = self.config.objective.reward_weights.to_dict()
        unknown = set(weights) - set(self.reward_names)
        if unknown:
            raise config_lib.ConfigError(
                f"objective.reward_weights names {sorted(unknown)}; the task's rewards are "
                f"{self.reward_names}"
            )
        if not weights:
            return r_pgk[..., self.reward_names.index("correctness")]
        w = jnp.asarray([weights.get(n, 0.0) for n in self.reward_names], jnp.float32)
        return jnp.einsum("pgk,k->pg", r_pgk, w)

    def _advantages(self, r_pg, r_pgk, batch):
        o = self.config.objective
        name = o.advantage
        kwargs = o.advantage_kwargs.to_dict()
        mask = jnp.asarray(batch["loss_mask"])
        if adv_lib.advantage_level(name) == "group":
            multi = name in ("gdpo", "gd2po")
            if multi:
                weights = o.reward_weights.to_dict()
                kwargs.setdefault(
                    "reward_weights",
                    [weights.get(n, 0.0) for n in self.reward_names] if weights else None,
                )
            a_pg = adv_lib.ADVANTAGES.get(name)(r_pgk if multi else r_pg, **kwargs)
            return adv_lib.sequence_to_tokens(a_pg.reshape(-1), mask)
        stats = _stats_for_advantage(batch)
        if name == "opd_hybrid":  # the verifier's part: GRPO on the sequence rewards
            kwargs["seq_adv"] = adv_lib.ADVANTAGES.get("grpo")(r_pg)
        if "group_size" in config_lib.keyword_names(adv_lib.ADVANTAGES.get(name)):
            kwargs.setdefault("group_size", self.config.rollout.group_size)
        return adv_lib.ADVANTAGES.get(name)(stats, **kwargs) * mask

    def _run_rl(self, stop: StopRequest) -> dict[str, Any]:
        c = self.config
        objective = objective_section(c.objective)
        losses.validate_objective_config(
            objective, available=self._available_stats() | {"logp", "old_logp", "mask"}
        )
        rows = c.data.prompt_batch * c.rollout.group_size
        mb_rows = rows // c.train.minibatches
        batch_keys = ["tokens", "attention_mask", "loss_mask", "old_logp", "advantages"]
        batch_keys += [k for k in ("ref_logp", "teacher_logp") if k in self._available_stats()]
        update = self.make_rl_update(batch_keys)
        update_groups = self._rollout_layout(self._micro_rows())["group_size"]
        data = make_prompt_iterator(
            self.task, split="train", batch_size=c.data.prompt_batch, seed=c.seed
        )
        meta = self._restore()
        if meta and meta.get("data") is not None:
            data.set_state(_decode_state(meta["data"]))
        start = int(self.state.step)
        if start == 0 and c.eval.at_start:
            ev = self.evaluate()
            self.history["eval"].append(dict(step=0, **ev))
            self.writer.write_scalars(0, ev)
            self._print("[rl] step 0: " + _fmt(ev))
        bar = ProgressBar(c.train.steps, initial=start, desc="rl") if self.is_main else None
        for step in self._steps_left(start):
            t0 = time.perf_counter()
            examples = _rows(next(data))
            batch, info = self._rl_batch(examples, self._next_key())
            # epochs x minibatches over a fixed permutation per epoch
            step_metrics = []
            # one device->host copy per step; minibatches are sliced from it (rewards already
            # needed the completions on the host)
            host_batch = jax.device_get({k: batch[k] for k in batch_keys})
            for _ in range(c.train.epochs):
                perm = self._minibatch_order(rows, update_groups)
                for j in range(c.train.minibatches):
                    idx = perm[j * mb_rows : (j + 1) * mb_rows]
                    mb = {k: v[idx] for k, v in host_batch.items()}
                    self.state, m = update(self.state, sharding.shard_batch(mb, self.mesh))
                    step_metrics.append(m)
            self.state = self.state.replace(step=self.state.step + 1)
            done = step + 1
            dt = time.perf_counter() - t0
            if done % c.train.log_every == 0 or done == c.train.steps:
                scalars = self._rl_scalars(step_metrics, info, dt)
                self.writer.write_scalars(done, scalars)
                if bar:
                    bar.update(
                        done, {"reward": scalars["reward/total"], "loss": scalars["train/loss"]}
                    )
            if self.rollout_log and done % c.train.rollout_log_every == 0:
                self._log_rollouts(done, examples, info, batch)
            outcome = self._end_of_step(done, data, stop, "rl")
            if outcome == "signal":
                return dict(stopped=True, step=done, history=self.history)
            if outcome == "target":
                break
        return self._finish(bar)

    def _available_stats(self) -> set[str]:
        out = set()
        if self.ref_params is not None:
            out.add("ref_logp")
        if self.teacher is not None:
            out.add("teacher_logp")
        return out

    def _rl_scalars(self, step_metrics, info, dt) -> dict[str, float]:
        m = jax.device_get(step_metrics)
        scalars = {f"train/{k}": float(np.mean([x[k] for x in m])) for k in m[0]}
        r = info["rewards"]
        for i, name in enumerate(self.reward_names):
            scalars[f"reward/{name}"] = float(r[:, i].mean())
        scalars["reward/total"] = float(info["r_pg"].mean())
        scalars["reward/failed"] = float(info["n_failed"])
        scalars["rollout/zero_variance_groups"] = float(info["zero_var_groups"])
        scalars["rollout/response_length"] = float(info["lengths"].mean())
        scalars["rollout/seconds"] = info["t_rollout"]
        scalars["perf/step_seconds"] = dt
        scalars["perf/tokens_per_second"] = float(info["lengths"].sum()) / max(dt, 1e-9)
        scalars["train/skipped_updates_total"] = float(self.state.skipped)
        if "reverse_kl" in info:
            scalars["opd/reverse_kl"] = info["reverse_kl"]
        return scalars

    def _log_rollouts(self, step, examples, info, batch):
        g = self.config.rollout.group_size
        adv = np.asarray(batch["advantages"]).sum(-1) / np.maximum(
            np.asarray(batch["loss_mask"]).sum(-1), 1
        )
        for i in range(min(len(info["texts"]), 2 * g)):
            ex = examples[i // g]
            self.rollout_log.write(
                step=step,
                prompt=self.task.prompt(ex),
                completion=info["texts"][i],
                rewards=dict(zip(self.reward_names, map(float, info["rewards"][i]))),
                advantage=float(adv[i]),
            )


def _stats_for_advantage(batch):
    from jaxrl_frontier.objectives import TokenStats

    return TokenStats(
        logp=jnp.asarray(batch["old_logp"]),
        old_logp=jnp.asarray(batch["old_logp"]),
        mask=jnp.asarray(batch["loss_mask"]),
        ref_logp=batch.get("ref_logp"),
        teacher_logp=batch.get("teacher_logp"),
    )


def _rows(batch: dict) -> list[dict]:
    """A grain batch (dict of columns) -> list of example dicts."""
    if isinstance(batch, list):
        return batch
    n = len(next(iter(batch.values())))
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def _encode_state(state):
    if isinstance(state, bytes):
        return {"__bytes__": state.decode("latin-1")}
    return state


def _decode_state(state):
    if isinstance(state, dict) and "__bytes__" in state:
        return state["__bytes__"].encode("latin-1")
    return state


def _fmt(d: dict) -> str:
    return "  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())


def train(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict[str, Any]:
    """Build a Trainer and run it (resuming from workdir if it holds a checkpoint)."""
    return Trainer(config, workdir).run()
