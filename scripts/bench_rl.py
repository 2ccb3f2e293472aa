"""One full GRPO step, ours vs TRL's GRPOTrainer, on the same tiny Qwen2-shaped model
(vocab 512, hidden 256, 4 layers, 8 heads, 2 kv heads, MLP 768), CPU, same group size,
prompt batch, prompt and completion lengths.

    python scripts/bench_rl.py --out artifacts/bench_rl.json
    python scripts/bench_rl.py --steps 8 --torch-threads 1,2
    python scripts/bench_rl.py --model-dir /models/Qwen2.5-0.5B-Instruct --new-tokens 64

`bench_rl(args)` is the library entry (scripts/bench.py wires it as `rl`). TRL is not a
dependency of the project: install it for this benchmark only (`pip install trl`); without
it the TRL side is skipped with a message in the JSON.

A step, ours: `Trainer.rollout` (the RolloutProducer: the jitted sampler's rollout, reward
scoring, reference log-probs when configured, group advantages) + the Learner's jitted,
donated update (GRPO loss, clip + AdamW); time until the new state is ready. TRL: one
`GRPOTrainer` optimizer step (generate, reward, log-probs, loss, backward, AdamW), timed by
a callback from step begin to step end. Both: the first `--warmup` steps (compiles, caches)
are reported apart; the figure is the median of the rest. Each side loads the same random
weights and tokenizer from one HF directory (ours through `model.init='hf'`). Our prompts
(the arithmetic task's, a few real tokens) are left-padded to the same 16 positions TRL's
16-token prompts take, so both sides run the same shapes.

`--model-dir`: both sides load that local Hugging Face directory (weights and tokenizer)
instead of the random tiny model, and both take the arithmetic task's prompt texts. TRL
then pads each batch to its longest prompt (`mean_prompt_tokens` in its JSON) while ours
pads to `--prompt-len`: ours runs at least as many prompt positions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_common  # noqa: E402  (scripts/ is on sys.path when run or imported)

TINY = bench_common.TINY_QWEN2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=10, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (TRL's default 0)")
    p.add_argument(
        "--torch-threads",
        type=bench_common.ints,
        default=[1, 2],
        help="TRL runs once per value (on a shared 2-core CPU, 2 threads can be far slower)",
    )
    p.add_argument("--no-trl", action="store_true")
    p.add_argument(
        "--model-dir",
        default="",
        help="a local Hugging Face directory (config, weights, tokenizer) for both sides "
        "instead of the random tiny model; prompts are then the arithmetic task's texts",
    )
    p.add_argument(
        "--no-share-prompt",
        action="store_true",
        help="ours: run every row's prompt (train.share_prompt_forward=False)",
    )


def save_tiny_model(path: str, seed: int = 0) -> None:
    """Random Qwen2-shaped weights in HF format (f32)."""

    from jaxrl_frontier.models import hf
    from jaxrl_frontier.models.transformer import ModelConfig

    cfg = ModelConfig(**TINY, qkv_bias=True, rope_theta=1_000_000.0, family="qwen2")
    from jaxrl_frontier.models.random_init import random_model

    model = random_model(cfg, seed=seed)
    hf.save(model, path, dtype="float32")


# ----------------------------------------------------------------------------- ours


def _our_config(args, model_dir: str, workdir: str):
    from jaxrl_frontier import config as config_lib

    c = config_lib.base_config()
    c.workdir = workdir
    c.mesh.num_devices = 1
    c.model.init, c.model.path = "hf", model_dir
    c.tokenizer = dict(kind="hf", path=model_dir)  # the tokenizer TRL loads
    c.task.kwargs = dict(max_digits=3)
    c.data.prompt_batch = args.prompts
    c.data.max_prompt_len = args.prompt_len
    c.rollout.group_size = args.group_size
    c.rollout.max_new_tokens = args.new_tokens
    c.objective.kl_coef = args.beta
    c.train.recompute_old_logp = False  # the sampler's log-probs (TRL: none at 1 iteration)
    c.train.share_prompt_forward = not args.no_share_prompt
    c.eval.at_start = False
    return c


def bench_ours(args, model_dir: str) -> dict:
    import jax

    from jaxrl_frontier.trainer import Trainer

    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer(_our_config(args, model_dir, workdir))
        n = args.warmup + args.steps
        cfg = trainer.policy.cfg  # 6 N T for the matmul params (output layer included)
        rows = args.prompts * args.group_size
        shared = trainer.learner.update_groups > 1
        prompt_rows = args.prompts if shared else rows  # prompts run once per group
        tokens = prompt_rows * args.prompt_len + rows * args.new_tokens
        update_flops = 6 * (cfg.num_params() - cfg.vocab_size * cfg.hidden_size) * tokens
        examples = [trainer.task.example("train", i) for i in range(n * args.prompts)]
        times, rollouts, updates, lengths = [], [], [], []
        for i in range(n):
            t0 = time.perf_counter()
            rows = examples[i * args.prompts : (i + 1) * args.prompts]
            exp, info = trainer.rollout(rows, trainer._next_key())
            keys = sorted(exp.update_batch())
            select, update = trainer.learner.programs(keys)
            mb = select(exp.update_batch(), np.arange(exp.num_rows))
            jax.block_until_ready(mb)
            t1 = time.perf_counter()  # the rollout batch is ready here: nothing in flight
            trainer.state, metrics = update(trainer.state, mb)
            trainer.state = trainer.state.replace(step=trainer.state.step + 1)
            jax.block_until_ready((trainer.state, metrics))
            times.append(time.perf_counter() - t0)
            updates.append(time.perf_counter() - t1)
            rollouts.append(info["rollout_seconds"])
            lengths.append(float(np.asarray(exp.loss_mask).sum(1).mean()))
        timed = times[args.warmup :]
        seconds = statistics.median(timed)
        return dict(
            seconds_per_step=seconds,
            rollout_seconds=statistics.median(rollouts[args.warmup :]),
            rollout_fraction=statistics.median(rollouts[args.warmup :]) / seconds,
            update_seconds=statistics.median(updates[args.warmup :]),
            share_prompt_forward=shared,
            update_tokens=tokens,
            update_gflops=update_flops / 1e9,
            update_achieved_gflops=update_flops / statistics.median(updates[args.warmup :]) / 1e9,
            warmup_seconds=times[: args.warmup],
            compile_s=sum(times[: args.warmup]) - args.warmup * seconds,
            times=timed,
            mean_completion_len=float(np.mean(lengths)),
            traces=dict(trainer.sampler.num_traces),
            update_cache_size=update._cache_size(),
            computes=["rollout (+ behaviour log-probs)", "rewards"]
            + (["ref_logp"] if "ref_logp" in keys else [])
            + ["advantages", "update"],
            threads=(
                "XLA CPU default (intra-op pool over all cores)"
                if jax.default_backend() == "cpu"
                else f"on {jax.default_backend()}"
            ),
            cpu_count=os.cpu_count(),
        )


# ----------------------------------------------------------------------------- TRL


def _tokenizer(vocab: int):
    """A word-level tokenizer over 'w0'..'w{V-1}' (pad w0, eos w1): one token per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="w0", eos_token="w1", unk_token="w2", padding_side="left"
    )


def bench_trl(args, model_dir: str, threads: int) -> dict:
    import datasets
    import torch
    import transformers
    import trl

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    n_steps = args.warmup + args.steps
    if args.model_dir:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        prompts = _task_prompts(n_steps * args.prompts)
    else:
        tokenizer = _tokenizer(TINY["vocab_size"])
        rng = np.random.default_rng(0)
        prompts = [  # exactly prompt_len words, one token each
            " ".join(f"w{t}" for t in rng.integers(3, TINY["vocab_size"], args.prompt_len))
            for _ in range(n_steps * args.prompts)
        ]
    prompt_tokens = [len(tokenizer(p)["input_ids"]) for p in prompts]

    def reward(completions, **kwargs):  # cheap, like a verifier: count one string
        return [float(c.count("w7" if not args.model_dir else "7")) for c in completions]

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    gen_times: list[float] = []
    generate = model.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = generate(*a, **kw)
        gen_times.append(time.perf_counter() - t0)
        return out

    model.generate = timed_generate
    step_times: list[float] = []

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **kw):
            step_times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        config = trl.GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts * args.group_size,
            num_generations=args.group_size,
            max_completion_length=args.new_tokens,
            max_steps=n_steps,
            learning_rate=1e-4,
            beta=args.beta,
            temperature=1.0,
            use_cpu=not torch.cuda.is_available(),
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=10**6,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        trainer.train()
    timed = step_times[args.warmup :]
    gens = gen_times[args.warmup :]
    seconds = statistics.median(timed)
    return dict(
        seconds_per_step=seconds,
        generate_seconds=statistics.median(gens) if gens else None,
        generate_fraction=(statistics.median(gens) / seconds) if gens else None,
        warmup_seconds=step_times[: args.warmup],
        times=timed,
        mean_prompt_tokens=float(np.mean(prompt_tokens)),
        torch_threads=threads,
        computes=["generate", "rewards", "logp (current, + ref when beta > 0)", "update"],
        trl=trl.__version__,
        torch=torch.__version__,
        transformers=transformers.__version__,
    )


def _task_prompts(n: int) -> list[str]:
    """The arithmetic task's first n training prompts (the texts our side samples from)."""
    from jaxrl_frontier.tasks import make_task

    task = make_task("arithmetic", max_digits=3)
    return [task.prompt(task.example("train", i)) for i in range(n)]


def _model_description(model_dir: str) -> dict:
    with open(Path(model_dir) / "config.json") as f:
        hf_config = json.load(f)
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size")
    keys += ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "torch_dtype")
    return dict(path=str(model_dir), **{k: hf_config.get(k) for k in keys})


def bench_rl(args) -> dict:
    """A full GRPO step (rollout, rewards, log-probs, update): ours vs TRL GRPOTrainer, CPU."""

    if args.model_dir and not (Path(args.model_dir) / "config.json").is_file():
        raise SystemExit(f"--model-dir {args.model_dir}: no config.json (a Hugging Face directory)")
    result = dict(
        **bench_common.machine_info(),
        model=(
            _model_description(args.model_dir)
            if args.model_dir
            else TINY | dict(family="qwen2", qkv_bias=True, dtype="float32")
        ),
        prompts=args.prompts,
        group_size=args.group_size,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        beta=args.beta,
        steps=args.steps,
        warmup=args.warmup,
    )
    with tempfile.TemporaryDirectory() as tiny_dir:
        model_dir = args.model_dir
        if not model_dir:
            model_dir = tiny_dir
            save_tiny_model(model_dir)
            _tokenizer(TINY["vocab_size"]).save_pretrained(model_dir)
        result["ours"] = ours = bench_ours(args, model_dir)
        print(f"[ours] {json.dumps(ours)}", file=sys.stderr)
        result["trl"] = {}
        if args.no_trl:
            result["trl_skipped"] = "--no-trl"
            return result
        try:
            import trl  # noqa: F401
        except ImportError:
            result["trl_skipped"] = (
                "trl is not installed (not a project dependency): `pip install trl` to compare"
            )
            print(f"[trl] skipped: {result['trl_skipped']}", file=sys.stderr)
            return result
        for threads in args.torch_threads:
            row = bench_trl(args, model_dir, threads)
            row["ours_speedup"] = row["seconds_per_step"] / ours["seconds_per_step"]
            result["trl"][f"threads_{threads}"] = row
            print(f"[trl threads={threads}] {json.dumps(row)}", file=sys.stderr)
    return result


def main(argv=None) -> dict:
    return bench_common.standalone_main("rl", __doc__, add_arguments, bench_rl, argv)


if __name__ == "__main__":
    main()
