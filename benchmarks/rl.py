"""One full GRPO step, ours against TRL's `GRPOTrainer`, on the same weights and shapes.

    python benchmarks/bench.py rl --config=benchmarks/configs/grpo_random_qwen2.py
    python benchmarks/bench.py rl --steps 8 --torch-threads 1,2 --config.data.prompt_batch=4
    python benchmarks/bench.py rl --rounds 3 --torch-threads 2 --config=configs/smollm2_reasoning.py

The shapes come from the config (`data.prompt_batch` prompts x `rollout.group_size`
completions of `rollout.max_new_tokens` tokens, prompts of `data.max_prompt_len`
positions, `objective.kl_coef` as TRL's beta, `optimizer.lr`, `rollout.temperature`).

Each side in a process of its own (benchmarks/peers.py), one after the other. This process
(neither jax nor torch) writes a word-level tokenizer (`save_tokenizer`: one token a word) into
a Hugging Face directory; the JAX child adds the config's random model to it and trains
`warmup + steps` steps with `trainer.train` (`model.init='hf'`, `tokenizer.kind='hf'` on
that directory): a step is the trainer's own (prompts, rollout, rewards, advantages,
update), its time `perf/step_seconds`. A TRL child per torch thread count,
gradient-checkpointing setting and host allocator (`--trl-pages`: the huge pages every side
inherits from bench.py, jaxrl_frontier/core/host_memory.py, and the machine's default) loads
the same directory and times `GRPOTrainer` optimizer steps (generate, reward, log-probs,
loss, backward, AdamW) with a callback. The figure is the median after the warm-up steps;
the compared TRL figure is its fastest setting, the others reported beside it.

Rounds (`--rounds R`): the sides run in turn R times (ours, then each TRL setting); each
figure is the median of the rounds' and each ratio the median of the rounds' own ratios,
so a drift of the machine's speed between rounds cancels (on the 2-core CPU here ours
took 11.2 s a step in one run and 8.5 s in another 20 minutes later).

Prompts: ours are the arithmetic task's (left-padded to `data.max_prompt_len`), TRL's
`data.max_prompt_len` random words of one token each: the same prompt positions, and
random weights make the contents irrelevant to the cost. Rewards are cheap on both sides.

A checkpoint (`model.init = 'hf'`, e.g. `--config=configs/smollm2_reasoning.py`): both sides
load its directory (weights, tokenizer, chat template; the JSON records the weights'
sha256); ours trains on the config's task as a run would, TRL on the same task's first
train prompts (the JAX child hands them over already in the chat template, as plain text:
the same prompt tokens on both sides, `prompt_tokens`). Both stop a completion at EOS, so
the completion lengths are recorded on both sides (`mean_completion_len`) beside the step
times; they differ by chance, and the side with the longer completions does more work.
`--completions full` removes that: every completion runs to `rollout.max_new_tokens` on both
sides (ours with `rollout.ignore_eos`, TRL with `min_new_tokens` at that length, which keeps
EOS from being sampled), so both generate, score and train on the same number of tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common, peers

DEFAULT_CONFIG = "benchmarks/configs/grpo_random_qwen2.py"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=10, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out (>= 1: compiles)")
    p.add_argument("--torch-threads", type=common.ints, default=[1, 2])
    p.add_argument("--no-trl", action="store_true")
    p.add_argument(
        "--rounds", type=int, default=1, help="alternating rounds of every side (ratio: median)"
    )
    p.add_argument(
        "--trl-checkpointing",
        type=common.choices_of("off", "default"),
        default=["off", "default"],
        help="TRL's gradient checkpointing settings timed: off, default (on), or both",
    )
    peers.add_pages_argument(p, "--trl-pages", "TRL")
    p.add_argument(
        "--completions",
        choices=("eos", "full"),
        default="eos",
        help="eos: both sides stop a completion at EOS, as a run trains; full: every "
        "completion runs to max_new_tokens on both sides (the same work)",
    )


SPECIAL = dict(pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")  # ids 0, 1, 2


def save_tokenizer(path: str, vocab: int) -> None:
    """A word-level tokenizer: ids 0, 1, 2 the `SPECIAL` tokens, then 'w3'..'w{vocab-1}', one
    token a word (special names that are no word's prefix: added tokens match inside words),
    as a Hugging Face tokenizer.json + tokenizer_config.json (read by ours and by TRL)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {name: i for i, name in enumerate(SPECIAL.values())}
    words.update({f"w{i}": i for i in range(len(words), vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    Path(path).mkdir(parents=True, exist_ok=True)
    tok.save(str(Path(path) / "tokenizer.json"))
    config = dict(tokenizer_class="PreTrainedTokenizerFast", padding_side="left", **SPECIAL)
    (Path(path) / "tokenizer_config.json").write_text(json.dumps(config))


# ----------------------------------------------------------------------------- ours (JAX)


def task_prompts(config, n: int) -> dict:
    """The first `n` train prompts of the config's task as the run sees them: texts already
    in the model's chat template (system message included), and their token counts under
    the run's tokenizer. The TRL side takes the texts as plain-text prompts, so both sides
    start from the same tokens (handing them over as chat messages would wrap them in the
    template a second time: about 30 more prompt tokens a row for TRL)."""
    from jaxrl_frontier.data.tasks import task_for
    from jaxrl_frontier.run import build
    from jaxrl_frontier.run.config import sections

    tokenizer = build.build_tokenizer(config)
    task = task_for(sections.task_options(config), tokenizer)
    texts = [task.prompt(task.example("train", i)) for i in range(n)]
    return dict(texts=texts, tokens=[len(tokenizer.encode(t)) for t in texts])


def time_ours(request: dict) -> dict:
    """The JAX child: save the random model (or keep the config's checkpoint), train warmup
    + steps steps, read the times."""
    from benchmarks import sampler
    from jaxrl_frontier.models import hf
    from jaxrl_frontier.run import trainer

    config = common.load_config(request["config_args"], DEFAULT_CONFIG)
    model_dir, n = request["model_dir"], request["warmup"] + request["steps"]
    prompts = None
    if request.get("checkpoint"):  # the config's own checkpoint, tokenizer and task
        prompts = task_prompts(config, n * config.data.prompt_batch)
    else:
        hf.save(sampler.build_model(config), model_dir, dtype="float32")
        config.model.update(init="hf", path=model_dir)
        config.tokenizer.update(kind="hf", path=model_dir)
    config.train.update(steps=n, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    config.eval.at_start = False
    counter = common.CompileCounter()
    with tempfile.TemporaryDirectory() as workdir:
        t0 = time.time()
        trainer.train(config, workdir)
        wall = time.time() - t0
        rows = [json.loads(line) for line in open(Path(workdir) / "metrics.jsonl")]
    rows, compiles = [r for r in rows if "perf/step_seconds" in r], counter.times
    timed = rows[request["warmup"] :]
    times = [r["perf/step_seconds"] for r in timed]
    seconds = statistics.median(times)
    rollout = statistics.median(r["rollout/seconds"] for r in timed)
    return dict(
        **common.machine_info(),
        seconds_per_step=seconds,
        rollout_seconds=rollout,
        rollout_fraction=rollout / seconds,
        times=times,
        warmup_seconds=[r["perf/step_seconds"] for r in rows[: request["warmup"]]],
        run_wall_s=wall,
        compiles=len(compiles),
        # between the end of the warm-up and the last step's row (the run's final eval and
        # export compile their own programs after it)
        compiles_in_timed_steps=sum(
            rows[request["warmup"] - 1]["time"] < t <= rows[-1]["time"] for t in compiles
        ),
        mean_completion_len=statistics.median(r["rollout/response_length"] for r in timed),
        threads="XLA CPU default (intra-op pool over all cores)",
        task_prompts=prompts,
        prompt_tokens=prompts and statistics.mean(prompts["tokens"]),
    )


# ----------------------------------------------------------------------------- orchestration


ROUND_KEYS = ("seconds_per_step", "rollout_seconds", "rollout_fraction")


def one_round(request: dict, trl_request: dict, args) -> dict:
    """One round: ours, then TRL at each checkpointing setting, thread count and host
    allocator, each in its own process -> {'ours': row, 'checkpointing_S/threads_N': row,
    'checkpointing_S/threads_N/default_pages': row, ...}; TRL's rows
    hold `ours_speedup`, this round's ratio (or 'trl_skipped', TRL's error)."""
    ours = peers.run_child("benchmarks.rl", request)
    print(f"[ours] {json.dumps(ours)}", file=sys.stderr)
    prompts, out = ours.pop("task_prompts"), dict(ours=ours)
    if args.no_trl:
        return out
    for checkpointing in args.trl_checkpointing:
        req = dict(trl_request, task_prompts=prompts, gradient_checkpointing=checkpointing)
        try:
            runs = peers.thread_runs("benchmarks.peer_trl", req, args.torch_threads, args.trl_pages)
        except peers.ChildError as e:  # trl not installed: said in the JSON
            return dict(ours=ours, trl_skipped=str(e)[-500:])
        for name, row in runs.items():
            row["ours_speedup"] = row["seconds_per_step"] / ours["seconds_per_step"]
            out[f"checkpointing_{checkpointing}/{name}"] = row
            print(f"[trl checkpointing_{checkpointing}/{name}] {json.dumps(row)}", file=sys.stderr)
    return out


def trl_rounds(rounds: list[dict], name: str) -> dict:
    """TRL setting `name` over the rounds: each figure the median of the rounds', and the
    ratio to ours the median of the rounds' own ratios (each round's sides ran back to
    back, so a drift of the machine's speed between rounds cancels in it)."""
    row = common.median_of_rounds([r[name] for r in rounds], ROUND_KEYS)
    row["ours_speedup"] = statistics.median(r[name]["ours_speedup"] for r in rounds)
    return row


def bench_rl(args) -> dict:
    """A full GRPO step: ours vs TRL `GRPOTrainer` (each in its own process), same weights."""
    config_args = list(getattr(args, "config_args", []))
    if args.completions == "full":  # every completion max_new_tokens long (module docstring)
        config_args.append("--config.rollout.ignore_eos=True")
    config = common.load_config(config_args, DEFAULT_CONFIG)
    shape = dict(
        prompts=config.data.prompt_batch,
        group_size=config.rollout.group_size,
        prompt_len=config.data.max_prompt_len,
        new_tokens=config.rollout.max_new_tokens,
        beta=config.objective.kl_coef,
        temperature=config.rollout.temperature,
        lr=config.optimizer.lr,
    )
    result = dict(
        **common.machine_info(jax_device=False),
        config_args=config_args or [f"--config={DEFAULT_CONFIG}"],
        model=common.config_text(config.model),
        **shape,
        steps=args.steps,
        warmup=args.warmup,
        rounds=args.rounds,
        completions=args.completions,
        processes="ours, and TRL at each thread count and checkpointing setting, each alone, "
        "in turn, each round",
    )
    ckpt = common.checkpoint(config)
    result["checkpoint"] = ckpt and {k: v for k, v in ckpt.items() if k != "config"}
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = ckpt["dir"] if ckpt else scratch
        if not ckpt:
            save_tokenizer(model_dir, config.model.vocab_size)
        request = dict(
            config_args=config_args,
            model_dir=model_dir,
            warmup=args.warmup,
            steps=args.steps,
            checkpoint=bool(ckpt),
        )
        trl_request = dict(request, vocab=config.model.vocab_size, **shape)
        if args.completions == "full":
            trl_request["min_new_tokens"] = shape["new_tokens"]
        rounds = [one_round(request, trl_request, args) for _ in range(args.rounds)]
    ours = result["ours"] = common.median_of_rounds([r.pop("ours") for r in rounds], ROUND_KEYS)
    result["device"], result["device_kind"] = ours["device"], ours["device_kind"]
    skipped = [r.pop("trl_skipped") for r in rounds if "trl_skipped" in r]
    if args.no_trl or skipped:
        result["trl_skipped"] = "--no-trl" if args.no_trl else skipped[0]
        return result
    result["trl"] = {name: trl_rounds(rounds, name) for name in rounds[0]}
    # compared with TRL's fastest setting, gradient checkpointing on or off, at any threads
    result["trl_compared"] = peers.best_of(result["trl"], "seconds_per_step", lower_is_better=True)
    return result


if __name__ == "__main__":
    peers.child_main(time_ours, peers.JAX_SIDE)
