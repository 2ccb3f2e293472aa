"""The TRL side of the rl benchmark, in its own process (benchmarks/peers.py).

Request (JSON on stdin): model_dir (weights and tokenizer), vocab, prompts, group_size,
prompt_len, new_tokens, beta, temperature, lr, warmup, steps, threads, task_prompts (a
checkpoint's run: {texts, tokens}, the task's prompts already in the chat template, taken
as plain text) and gradient_checkpointing: 'off' (the compared figure) or 'default'
(GRPOConfig's own, recorded as `gradient_checkpointing`); min_new_tokens (optional): no
completion ends before it (`--completions full`: EOS is not sampled before the budget).
Times `GRPOTrainer` optimizer steps with a callback from step begin to step end, and each
step's generation (`time_generation`); the medians after `warmup` steps.
"""

from __future__ import annotations

import statistics
import tempfile
import time


def checkpoint_prompts(task: dict, n: int) -> list[str]:
    """A checkpoint run's n TRL prompts: the task's texts (`task_prompts` of benchmarks/rl.py),
    already in the chat template, cycled. Plain text, not chat messages: TRL would wrap
    messages in the template a second time (a second system turn, about 30 more tokens)."""
    texts = task["texts"]
    return (texts * (n // len(texts) + 1))[:n]


def time_grpo(request: dict) -> dict:
    import datasets
    import numpy as np
    import torch
    import transformers
    import trl

    torch.set_num_threads(request["threads"])
    torch.manual_seed(0)
    n_steps = request["warmup"] + request["steps"]
    n_prompts = n_steps * request["prompts"]
    task = request.get("task_prompts")
    if task:  # a checkpoint: its tokenizer, the task's prompts already in its chat template
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            request["model_dir"], padding_side="left"
        )
        prompts = checkpoint_prompts(task, n_prompts)

        def reward(completions, **kwargs):  # cheap, like a verifier: find a digit
            return [float(any(ch.isdigit() for ch in c)) for c in completions]

    else:
        # from the file itself: AutoTokenizer's object from this directory tokenizes
        # `tokenizer(text=[...])`, TRL's call, to empty ids (transformers 5.24)
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_file=f"{request['model_dir']}/tokenizer.json",
            pad_token="<pad>",
            eos_token="<eos>",
            unk_token="<unk>",
            padding_side="left",
        )
        rng = np.random.default_rng(0)
        prompts = [  # exactly prompt_len words of one token each
            " ".join(f"w{t}" for t in rng.integers(3, request["vocab"], request["prompt_len"]))
            for _ in range(n_prompts)
        ]

        def reward(completions, **kwargs):  # cheap, like a verifier: count one word
            return [float(c.count("w7")) for c in completions]

    model = transformers.AutoModelForCausalLM.from_pretrained(
        request["model_dir"], dtype=torch.float32
    )
    if not task:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    step_times: list[float] = []
    lengths: list[float] = []

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **kw):
            step_times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    with tempfile.TemporaryDirectory() as out:
        settings = dict(
            output_dir=out,
            per_device_train_batch_size=request["prompts"] * request["group_size"],
            num_generations=request["group_size"],
            max_completion_length=request["new_tokens"],
            max_steps=n_steps,
            learning_rate=request["lr"],
            beta=request["beta"],
            temperature=request["temperature"],
            use_cpu=not torch.cuda.is_available(),
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=1,  # each step's completion lengths (`on_log`)
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
        )
        if request.get("min_new_tokens"):
            settings["generation_kwargs"] = dict(min_new_tokens=request["min_new_tokens"])
        if request["gradient_checkpointing"] == "off":
            settings["gradient_checkpointing"] = False
        config = trl.GRPOConfig(**settings)
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        generate_times = time_generation(trainer)
        trainer.train()
    timed = step_times[request["warmup"] :]
    generation = generate_times[request["warmup"] :]
    return dict(
        seconds_per_step=statistics.median(timed),
        times=timed,
        warmup_seconds=step_times[: request["warmup"]],
        torch_threads=torch.get_num_threads(),
        gradient_checkpointing=bool(config.gradient_checkpointing),
        gradient_checkpointing_setting=request["gradient_checkpointing"],
        trl=trl.__version__,
        # as TRL tokenizes a plain-text prompt (no special tokens added)
        prompt_tokens=float(
            np.mean([len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts])
        ),
        mean_completion_len=statistics.median(lengths[request["warmup"] :]) if lengths else None,
        # the rollout's share, as ours reports it (one generation a step here)
        rollout_seconds=statistics.median(generation) if len(generation) == len(timed) else None,
    )


def time_generation(trainer) -> list[float]:
    """A list that fills with each call's seconds of the trainer's generation
    (`GRPOTrainer._generate`, TRL 1.x: sampling the completions); it stays empty where a
    TRL lacks that method, and the child then reports rollout_seconds None."""
    times: list[float] = []
    generate = getattr(trainer, "_generate", None)
    if generate is None:
        return times

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        times.append(time.perf_counter() - t0)
        return out

    trainer._generate = timed
    return times


if __name__ == "__main__":
    from benchmarks import peers

    peers.child_main(time_grpo, peers.TORCH_SIDE)
