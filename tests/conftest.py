"""Session-wide test setup: 8 fake CPU devices for the sharding tests.

XLA reads the device count once, when jax first initialises its backend, so the flag must
be in the environment before any test module imports jax. Tests that do not build a mesh
are unaffected: arrays still default to device 0.
"""

import atexit
import os
import shutil
import tempfile

_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # append rather than setdefault, so other XLA flags a user set are kept
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

# Cheaper XLA CPU compiles: the suite is compile-bound on a 2-core CPU. LLVM -O0 with no
# expensive passes, and XLA:CPU's elemental IR emitters instead of its MLIR fusion emitters
# (compiles 2.6x cheaper here). Float results are not bitwise those of the default
# emitters (another exp/log/tanh approximation, another reduction order): tests compare
# runs under these same flags, and numbers recorded here (tests/fixtures/runlocal_metrics)
# are recorded under them. (A jaxlib without one of these flags stops at its first
# use naming it: "Unknown flag in XLA_FLAGS".)
_FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
    "--xla_cpu_use_fusion_emitters=false"
)
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + _FAST_COMPILE

# A persistent compilation cache, one directory per session, inherited by subprocesses
# (CLI and notebook tests): every compile after the first of a program is a cache read.
# Under pytest-xdist each worker gets a directory of its own (two processes never write the
# same entry at once).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if not os.environ.get("JAX_COMPILATION_CACHE_DIR") or _worker:
    _cache = tempfile.mkdtemp(prefix=f"jaxrl_test_jax_cache_{_worker}")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The benchmark harness waits for a quiet machine before timing a side; the tests run beside
# each other and time nothing, so any load passes here.
os.environ.setdefault("JAXRL_BENCH_QUIET_SHARE", "1.0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

# pytest imports this file by path (--import-mode=importlib, pyproject.toml) under its own
# name; the tests import its helpers as `conftest`: one module for both, not two copies
sys.modules.setdefault("conftest", sys.modules[__name__])

import ml_collections  # noqa: E402
import pytest  # noqa: E402  (after the flags on purpose: nothing above may import jax)
from file_order import SLOW_FILES_FIRST  # noqa: E402  (tests/file_order.py)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept


# Tiny HF configs (f32, hidden 64, 2 layers, 4 heads, 2 kv heads, vocab 128) covering every
# option the loader maps: rope scaling, tied embeddings, qkv bias, qk-norm, explicit head_dim.
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
HF_CASES = {
    "llama": ("LlamaConfig", {}),
    "llama_rope_llama3": (
        "LlamaConfig",
        dict(
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=4.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8,
            ),
        ),
    ),
    # YaRN (Qwen3's and GPT-OSS's long-context RoPE): a ramp over the dims at this tiny
    # original context, and the attention factor 0.1 ln 4 + 1 on cos and sin
    "llama_rope_yarn": (
        "LlamaConfig",
        dict(
            rope_scaling=dict(
                rope_type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=4.0
            ),
        ),
    ),
    "llama_rope_linear_tied": (
        "LlamaConfig",
        dict(rope_scaling=dict(rope_type="linear", factor=2.0), tie_word_embeddings=True),
    ),
    "qwen2": ("Qwen2Config", {}),
    "qwen2_tied": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),  # head_dim != hidden / heads on purpose
}


# The small model of the fast-path tests (tests/rl/learn/test_perf_paths.py, test_shared_prompt.py).
SMALL_MODEL = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)


def assert_same_loss_and_grads(a, b, atol: float = 1e-5):
    """a, b: ((loss, metrics), grads) from `jax.value_and_grad(loss_of, has_aux=True)`:
    the same loss (1e-6), the same metric names and values, the same gradients."""
    import jax
    import numpy as np

    ((l0, m0), g0), ((l1, m1), g1) = a, b
    np.testing.assert_allclose(l1, l0, atol=1e-6)
    assert set(m0) == set(m1)
    for k in m0:
        np.testing.assert_allclose(m1[k], m0[k], atol=atol, err_msg=k)
    for x, y in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(y, x, atol=atol, rtol=1e-4)


def assert_resumed_run_equal(full, resumed, full_dir, cut_dir, step: int) -> dict:
    """An uninterrupted trainer and one resumed on a cut workdir ended the same: bitwise
    equal train states and equal logged numbers at `step` (timings aside). Returns that
    step's metrics row."""
    import json

    import jax
    import numpy as np

    for a, b in zip(jax.tree.leaves(full.state), jax.tree.leaves(resumed.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = lambda d: [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    want = [r for r in rows(full_dir) if r["step"] == step and "train/loss" in r]
    got = [r for r in rows(cut_dir) if r["step"] == step and "train/loss" in r]
    numbers = lambda r: {k: v for k, v in r.items() if "time" not in k and "second" not in k}
    assert len(want) == len(got) == 1 and numbers(got[0]) == numbers(want[0])
    return want[0]


def run_trainer(config, workdir) -> tuple:
    """Train `config` in `workdir` with the evaluation stubbed out (pass@1 0) -> (trainer,
    summary, the logged rows that hold a train/loss)."""
    from jaxrl_frontier.run import trainer as tr

    trainer = tr.Trainer(config, str(workdir))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    summary = trainer.run()
    rows = [json.loads(line) for line in open(os.path.join(str(workdir), "metrics.jsonl"))]
    return trainer, summary, [r for r in rows if "train/loss" in r]


class Killed(Exception):
    """Stands for a kill -9 right after a checkpoint (tests/train/test_reliability.py sends
    real ones to scripts/train.py)."""


def run_killed_after(config, workdir, step: int) -> None:
    """Train `config` in `workdir` (evaluation stubbed out) and stop it dead once step
    `step`'s checkpoint is on disk: nothing after it runs, nothing is drained or saved."""
    from jaxrl_frontier.run import trainer as tr

    trainer = tr.Trainer(config, str(workdir))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    killed_after(trainer, step)
    try:
        trainer.run()
    except Killed:
        return
    raise AssertionError(f"the run ended before step {step}")


def killed_after(trainer, step: int) -> None:
    """Make `trainer.run()` raise `Killed` once step `step`'s checkpoint is on disk."""
    from jaxrl_frontier.train import hooks

    class KillAfter(hooks.Hook):  # after the trainer's hooks: the checkpoint is saved
        def after_step(self, end):
            if end.done == step:
                trainer.ckpt.wait()
                raise Killed

    trainer.hooks.append(KillAfter())


def override(config, overrides: dict):
    """config with {"section.name": value} set (one level of sections)."""
    for key, value in overrides.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


def small_rl_config(mode: str = "rl", num_devices: int = 1):
    """A base config for seconds-long trainer tests: one-digit additions (prompts of 5
    tokens), 4 prompts x 4 completions of 3 tokens, a d=32 model."""
    from jaxrl_frontier.run import config as config_lib

    c = config_lib.base_config()
    c.mode = mode
    c.mesh.num_devices = num_devices
    c.task.kwargs = dict(max_digits=1, ops="+", prompt_template="{a}{op}{b}=")
    c.data.max_prompt_len = 5
    c.data.prompt_batch = 4
    c.rollout.group_size = 4
    c.rollout.max_new_tokens = 3
    c.model.hidden_size, c.model.intermediate_size, c.model.num_heads = 32, 64, 4
    c.eval.at_start = False
    return c


def with_population(c, size: int = 2, **vary):
    """`c` with a population of `size` members, each `section__key=(values, ...)` varied
    (e.g. `objective__kl_coef=(0.02, 0.1)`)."""
    c.population.size = size
    for key, values in vary.items():
        section, name = key.split("__")
        c.population.vary[section][name] = values
    return c


def build_hf_model(case: str, seed: int = 0):
    """A random tiny transformers model (eval mode, f32, eager attention) for `case`.

    HF initialises norms to 1 and biases to 0, which would leave norm and bias mapping
    untested; every parameter is redrawn (norms around 1) so each one moves the logits.
    """
    import torch
    import transformers

    cls_name, extra = HF_CASES[case]
    config = getattr(transformers, cls_name)(**TINY, **extra, attn_implementation="eager")
    torch.manual_seed(seed)
    return redrawn(transformers.AutoModelForCausalLM.from_config(config).eval(), 0.1, seed)


def randomize_adapters(model, scale: float = 0.1, seed: int = 5) -> None:
    """Every LoRA B of `model` (in place) drawn N(0, scale^2), so the adapters act: at
    their initial B = 0 the adapted model is its base."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxrl_frontier.models import lora

    adapters, _ = lora.split(nnx.state(model))
    rng = np.random.RandomState(seed)
    for path, var in nnx.to_flat_state(adapters):
        if str(path[-1]).endswith("_lora_b"):
            var.set_value(jnp.asarray(rng.randn(*var.get_value().shape) * scale, jnp.float32))
    nnx.update(model, adapters)


def noisy_copy(model, scale: float = 0.3, seed: int = 1):
    """Our `model` with every array moved by `scale` of its own std in Gaussian noise: a
    draft the model accepts and rejects in turn."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)
    key = jax.random.key(seed)
    noisy = lambda x: x + scale * jnp.std(x) * jax.random.normal(key, x.shape, x.dtype)  # noqa: E731
    return nnx.merge(graphdef, jax.tree.map(noisy, state))


def assert_row_samplers_match_plain(model, draft, prompts) -> None:
    """Continuous batching (3 slots for 4 rows), partial rollouts (2 calls, the second
    batch begun in the first's idle slots, the first's rows cut at 4 tokens and continued)
    and speculative rollouts (`draft`, k = 3) give the plain sampler's greedy tokens,
    log-probs within 1e-5, the draft both accepted and rejected. prompts [2, >= 3] int32:
    left-padded in a bucket of 8 as rows of 6 and 3 tokens, 10 new tokens each, 2 a prompt
    (the partial sampler's second batch: the two rows swapped)."""
    import jax
    import numpy as np

    from jaxrl_frontier.sampling import (
        ContinuousSampler,
        Sampler,
        SamplingParams,
        SpeculativeSampler,
    )
    from jaxrl_frontier.sampling.partial import PartialSampler

    tokens = np.zeros((2, 8), np.int32)
    tokens[0, 2:], tokens[1, 5:] = prompts[0, :6], prompts[1, :3]
    mask = (tokens != 0).astype(np.int32)
    params = SamplingParams(max_new_tokens=10, n=2, greedy=True)
    samplers = {
        "plain": Sampler(model, pad_id=0, prompt_buckets=(8,)),
        "continuous": ContinuousSampler(model, slots=3, pad_id=0, prompt_buckets=(8,)),
        "speculative": SpeculativeSampler(model, draft, pad_id=0, k=3, prompt_buckets=(8,)),
    }
    out = {n: s.generate(tokens, mask, params, jax.random.key(0)) for n, s in samplers.items()}
    want, logp = (
        np.asarray(getattr(out["plain"], f)) for f in ("completion_tokens", "policy_logp")
    )
    for name in ("continuous", "speculative"):
        np.testing.assert_array_equal(np.asarray(out[name].completion_tokens), want, err_msg=name)
        np.testing.assert_allclose(np.asarray(out[name].policy_logp), logp, atol=1e-5)
    accepted = float(samplers["speculative"].stats["acceptance_rate"])
    assert 0.0 < accepted < 1.0, accepted  # drafts were rejected and accepted

    partial = PartialSampler(model, slots=3, budget=4, pad_id=0, prompt_buckets=(8,))
    swapped = (tokens[::-1].copy(), mask[::-1].copy())
    partial.begin_next(*swapped, jax.random.key(1))
    calls = [partial.generate(tokens, mask, params, jax.random.key(0), policy_version=0)]
    continued = partial.stats["continued_rows"]
    calls.append(partial.generate(*swapped, params, jax.random.key(1), policy_version=1))
    plain = samplers["plain"].generate(*swapped, params, jax.random.key(1))
    for got, ref in zip(calls, (out["plain"], plain)):
        np.testing.assert_array_equal(np.asarray(got.completion_tokens), ref.completion_tokens)
        # a continued row's log-probs come from its re-prefill: the same sums in another
        # order (1.05e-5 apart at |logp| = 2 measured on DeepSeek-V3's latent attention)
        np.testing.assert_allclose(got.policy_logp, ref.policy_logp, rtol=2e-5, atol=1e-5)
    assert continued + partial.stats["continued_rows"] > 0  # rows were cut and continued


def redrawn(model, scale: float, seed: int = 0):
    """A transformers `model` with every parameter redrawn in place: norms around 1, the rest
    N(0, scale^2). transformers initialises norms to 1 and biases to 0, which would leave
    their mapping untested; redrawn, each parameter moves the outputs."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(
                1.0 + 0.2 * torch.randn_like(p) if "norm" in name else scale * torch.randn_like(p)
            )
    return model


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """case -> (checkpoint dir, torch model), built once per test module on first use."""
    cache = {}

    def get(case: str):
        if case not in cache:
            model = build_hf_model(case)
            path = tmp_path_factory.mktemp(case)
            model.save_pretrained(path)  # safetensors by default
            cache[case] = (path, model)
        return cache[case]

    return get


# what the judge tests score: two prompts of a group of 2, their four completions, and the
# question each prompt's example asks (`JudgeScorer(question_of=...)`)
JUDGE_ROWS = dict(
    examples=({"q": "1+2=", "answer": 3}, {"q": "3+4=", "answer": 7}),
    texts=("3", "4", "7", "9"),
    group_size=2,
)


def judge_question(example: dict) -> str:
    return example["q"]


@pytest.fixture(scope="module")
def char_judge(tmp_path_factory):
    """A judge for the judge tests: a tiny random transformers Llama over `CharTokenizer`'s
    vocabulary (weights N(0, 0.3)), and ours loaded from its checkpoint."""
    import torch
    import transformers

    from jaxrl_frontier.models import hf
    from jaxrl_frontier.models.tokenizer import CharTokenizer

    shape = {**TINY, "vocab_size": CharTokenizer().vocab_size}
    config = transformers.LlamaConfig(**shape, attn_implementation="eager")
    torch.manual_seed(0)
    torch_model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in torch_model.parameters():
            p.normal_(0.0, 0.3)
    path = tmp_path_factory.mktemp("judge")
    torch_model.save_pretrained(path)
    return torch_model, hf.load(path)


def left_padded_batch(batch: int = 4, length: int = 12, vocab: int = 128, seed: int = 0):
    """(tokens, mask) int32 numpy [B, T]: row b has b*2 (mod T-1) left-padding slots."""
    import numpy as np

    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, vocab, size=(batch, length)).astype(np.int32)
    pads = [(2 * b) % (length - 1) for b in range(batch)]
    mask = np.array([[0] * p + [1] * (length - p) for p in pads], np.int32)
    return tokens * mask, mask


def hf_logits(model, tokens, mask):
    """transformers logits [B, T, V] (numpy f32) with our left-padding positions.

    HF derives no positions from the mask by itself, so pass cumsum(mask) - 1 (clipped at
    0), the positions our Transformer uses.
    """
    import numpy as np
    import torch

    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(tokens, dtype=torch.long),
            attention_mask=torch.as_tensor(mask, dtype=torch.long),
            position_ids=torch.as_tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()


def rel_diff(a, b, mask) -> float:
    """max |a - b| / max |b| over the real (mask 1) positions: logits against a reference."""
    import numpy as np

    real = mask.astype(bool)
    return float(np.abs(a - b)[real].max() / np.abs(b)[real].max())


def assert_save_round_trip(model, torch_model, path, tokens, mask, tol: float, **save_kwargs):
    """Our save (sharded into many files) loads into transformers as the same class with
    bitwise the tensors of `torch_model` and its logits (within `tol` of their scale), and
    back into ours with bitwise the same parameters. The transformers model read back."""
    import jax
    import numpy as np
    import torch
    from flax import nnx
    from transformers import AutoModelForCausalLM

    from jaxrl_frontier.models import hf

    hf.save(model, path, max_shard_size="20KB", **save_kwargs)
    back = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    assert type(back) is type(torch_model)
    with torch.no_grad():
        ours = dict(back.state_dict())
        for name, a in torch_model.state_dict().items():
            torch.testing.assert_close(ours[name], a, rtol=0, atol=0, msg=name)
    ref = hf_logits(torch_model, tokens, mask)
    assert rel_diff(hf_logits(back, tokens, mask), ref, mask) < tol
    again = hf.load(path)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return back


def random_model(cfg, seed: int = 0):
    """The model `cfg` builds (`hybrid.model_class`: a `Transformer`, or a
    `HybridTransformer` where it has linear-attention layers) with every parameter random
    (norms around 1, biases nonzero, std 0.2), so logits are O(1) and each parameter
    matters.

    Built abstractly and filled from numpy: eager jax.random init would compile one kernel
    per parameter shape, which dominates the runtime of these tiny tests.
    """
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxrl_frontier.models.hybrid import model_class

    graphdef, state = nnx.split(nnx.eval_shape(lambda: model_class(cfg)(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.RandomState(seed)
    for path, var in nnx.to_flat_state(state):
        base = 1.0 if "norm" in path else 0.0
        noise = 0.2 * rng.standard_normal(var.get_value().shape)
        var.set_value(jnp.asarray(base + noise, jnp.float32))
    return nnx.merge(graphdef, state)


@pytest.fixture
def count_compiles():
    """`with count_compiles() as seen:` -> `seen` lists the function name of every XLA
    compile inside the block (a `jax.monitoring` listener on backend compiles), eager ops
    included: a hot path called again with same-shaped inputs must leave it empty."""
    import contextlib

    import jax

    @contextlib.contextmanager
    def counting():
        seen: list[str] = []

        def listener(event, duration, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                seen.append(str(kwargs.get("fun_name", "")))

        jax.monitoring.register_event_duration_secs_listener(listener)
        try:
            yield seen
        finally:
            jax.monitoring.unregister_event_duration_listener(listener)

    return counting


# ----------------------------------------------------------------------------- runs of configs/

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every run here uses the same tiny shapes, so that they share compiled programs: one
# device, 1-digit addition ("3+4=" -> "7"), 8 prompts x 8 completions, no step-0 eval, an
# 8-prompt greedy eval at the last step only.
FAST = {
    "mesh.num_devices": 1,
    "model.init": "scratch",  # these runs test the trainer from a random policy (shaped
    "model.path": "",  # rewards give it advantages), not from the runlocal warm start
    "task.kwargs.max_digits": 1,
    "task.kwargs.ops": "+",
    "task.kwargs.prompt_template": "{a}{op}{b}=",
    "data.max_prompt_len": 5,  # BOS + "9+9="
    "data.prompt_batch": 8,
    "rollout.max_new_tokens": 3,  # "18" + EOS
    "rollout.group_size": 8,
    "train.minibatches": 1,
    "train.sft_batch": 64,
    "train.log_every": 1,
    "train.eval_every": 10**6,
    "train.checkpoint_every": 10**6,
    "eval.at_start": False,
    "eval.num_prompts": 8,  # 1-digit addition has 10 held-out prompts
    "eval.batch": 8,
    "eval.pass_k": 1,
}
# RL from scratch: a random policy is never correct, so shape the reward (format, length)
# for non-zero advantages from the first step.
RL = {
    "objective.reward_weights": ml_collections.ConfigDict(
        dict(correctness=1.0, format=0.5, length=0.1)
    ),
    "optimizer.lr": 5e-3,
    "optimizer.warmup_steps": 0,
}


def get_config(
    name: str, overrides: dict | None = None, arg: str | None = "runlocal"
) -> ml_collections.ConfigDict:
    """configs/<name>.py:<arg> (runlocal; None: the full config) with dotted-key overrides."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config(arg)
    for key, value in (overrides or {}).items():
        *parents, leaf = key.split(".")
        node = c
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def config_error(c, num_devices: int = 8) -> str:
    """The ConfigError `validate(c, num_devices)` raises, as its message."""
    from jaxrl_frontier.core.errors import ConfigError
    from jaxrl_frontier.run.config import validate

    with pytest.raises(ConfigError) as e:
        validate(c, num_devices=num_devices)
    return str(e.value)


def read_metrics(workdir) -> list[dict]:
    from jaxrl_frontier.train.metrics import METRICS_FILE

    with open(os.path.join(workdir, METRICS_FILE)) as f:
        return [json.loads(line) for line in f]


def series(rows: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in rows if key in r}


def host_leaves(tree) -> list:
    import jax
    import numpy as np

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def random_experience(rows=16, t=8, tp=5, seed=0, vocab=20):
    """An Experience of `rows` rows of `t` tokens (a `tp`-token prompt shared by each group
    of 4, completions of unequal lengths) with random behaviour log-probs and advantages."""
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_frontier.rl.experience import Experience

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t - tp + 1, rows)  # unequal token counts per row
    mask = (np.arange(t)[None] >= tp) & (np.arange(t)[None] < tp + lengths[:, None])
    mask = mask.astype(np.float32)
    z = lambda dtype=np.float32: np.zeros((rows, t), dtype)
    tokens = rng.integers(4, vocab, (rows, t))
    tokens[:, :tp] = np.repeat(tokens[::4, :tp], 4, 0)  # groups of 4 share their prompt
    return Experience(
        tokens=jnp.asarray(tokens, jnp.int32),
        attention_mask=jnp.asarray(np.arange(t)[None] < tp + lengths[:, None], jnp.int32),
        loss_mask=jnp.asarray(mask),
        old_logp=jnp.asarray(-rng.exponential(2.0, (rows, t)) * mask),
        advantages=jnp.asarray(rng.normal(size=(rows, 1)) * mask),
        rewards=jnp.zeros((rows, 1)),
        prompt_index=jnp.zeros(rows, jnp.int32),
        group_id=jnp.arange(rows) // 4,
        policy_version=jnp.zeros(rows, jnp.int32),
        turn_index=jnp.asarray(z(np.int32)),
    )
