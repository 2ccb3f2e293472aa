r"""Evaluate any policy (a workdir's export or a Hugging Face dir) on a task split.

    python scripts/evaluate.py --config=configs/grpo_arith.py --policy=runs/grpo_arith \
        --reference=runs/sft_arith --n=8 --rerank=progress,confidence,none --json=eval.json
    python scripts/evaluate.py --config=configs/sft_arith.py --policy=runs/sft_arith --entropy

Reports greedy pass@1, sampled pass@n and the mean solve rate (temperature 1), and best-of-n
accuracy under each reranker (one sample per prompt picked by the highest score); --n=0 runs the
greedy pass alone (e.g. HumanEval greedy pass@1):

    progress     sum_t [log pi_policy(y_t | .) - log pi_ref(y_t | .)] over the response: the
                 progress advantage ("Neglected Free Lunch from Post-training: Progress
                 Advantage for LLM Agents"); needs --reference (the RL run's starting point)
    confidence   (1/|y|) sum_t log pi_policy(y_t | .): the mean log-prob baseline
    none         the first sample (= the mean solve rate in expectation)

--entropy adds the policy's mean next-token entropy over its sampled completions (full
vocabulary): the pre-RL triage of "SFT Overtraining Predicts Rank Inversion via Entropy
Collapse Under RLVR" (a low-entropy SFT checkpoint is a risky GRPO start). Prints a table,
writes JSON with --json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl_frontier.core import sharding  # noqa: E402
from jaxrl_frontier.core.registry import Registry  # noqa: E402
from jaxrl_frontier.objectives.aggregation import token_mean  # noqa: E402
from jaxrl_frontier.objectives.logprobs import token_entropy as token_entropy_bt  # noqa: E402

# name -> fn(logp [N, T], ref_logp [N, T] | None, mask [N, T]) -> scores [N] (higher: better)
RERANKERS = Registry("reranker")


@RERANKERS.register("progress")
def progress(logp, ref_logp, mask):
    """sum_t m_t (log pi_policy - log pi_ref): the progress advantage of the response."""
    if ref_logp is None:
        raise ValueError("--rerank=progress needs --reference (the policy's starting point)")
    return np.sum(mask * (logp - ref_logp), axis=-1)


@RERANKERS.register("confidence")
def confidence(logp, ref_logp, mask):
    """(1/|y|) sum_t m_t log pi_policy: the mean log-prob of the response."""
    return np.sum(mask * logp, axis=-1) / np.maximum(np.sum(mask, axis=-1), 1)


@RERANKERS.register("none")
def no_rerank(logp, ref_logp, mask):
    """All equal: best-of-n picks the first sample."""
    return np.zeros(logp.shape[0])


def best_of_n(correct: np.ndarray, scores: np.ndarray) -> float:
    """Accuracy of the highest-scoring sample of each prompt (ties: the first); [P, N] each."""
    pick = np.argmax(scores, axis=1)
    return float(np.mean(correct[np.arange(len(pick)), pick]))


def token_entropy(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean over the masked tokens of H(pi(. | y_<t)): the package's `token_entropy` (aligned
    with the tokens) under the 'token_mean' aggregation; logits [B, T, V] (position t
    predicting t + 1), mask [B, T] on the predicted tokens (column 0, predicted by nothing,
    left out)."""
    return token_mean(token_entropy_bt(logits), jnp.asarray(mask).at[:, 0].set(0))


def evaluate_policy(
    config,
    policy,
    tokenizer,
    task,
    *,
    mesh,
    reference_params=None,
    n: int = 8,
    rerank: tuple[str, ...] = ("progress", "confidence", "none"),
    num_prompts: int | None = None,
    entropy: bool = False,
    seed: int = 0,
) -> dict[str, float]:
    """The figures of the module docstring for `policy` (an nnx Transformer): the run's own
    evaluation (`train.evaluation.evaluate`: the greedy pass, then n samples a prompt at
    temperature 1, in chunks of about eval.batch rows), each sampled chunk also scored by
    every reranker."""
    from flax import nnx

    from jaxrl_frontier.data.rewards.scorer import make_scorer
    from jaxrl_frontier.rl.learn.forward import make_logp_fn
    from jaxrl_frontier.run.config import sections
    from jaxrl_frontier.sampling import Sampler
    from jaxrl_frontier.train import evaluation

    c = config
    if n < 0:
        raise ValueError(f"--n = {n} must be >= 0 (0: the greedy pass alone)")
    rerankers = {name: RERANKERS.get(name) for name in (rerank if n else ())}
    if "progress" in rerankers and reference_params is None:
        raise ValueError("--rerank=progress needs --reference (the policy's starting point)")
    options = dataclasses.replace(
        sections.eval_options(c),
        num_prompts=num_prompts or c.eval.num_prompts,
        pass_k=max(n, 1),
        seed=seed,
        key_seed=seed,
        sampled_batch=max(1, c.eval.batch // max(n, 1)),
        sampled=n > 0,
    )
    sampler = Sampler(policy, pad_id=tokenizer.pad_id, mesh=mesh)
    graphdef, params = nnx.split(policy)
    sampler.update_weights(params, 0)
    logp_fn, tn = make_logp_fn(graphdef), options.max_new_tokens
    correct, scores, ents = [], {k: [] for k in rerankers}, []

    def on_sampled(chunk, rows):  # each chunk of the sampled pass, as evaluate rolls it
        correct.append(rows.correct > 0)
        ro = rows.batch
        seq = jnp.concatenate([ro.prompt_tokens, ro.completion_tokens], 1)
        am = jnp.concatenate([ro.prompt_mask, ro.completion_mask], 1)
        m = np.asarray(sharding.all_rows(ro.completion_mask)).astype(np.float32)
        # both scores from the same forward: the sampler's own log-probs differ by rounding,
        # which progress (a sum over the response) would rank by
        lp = np.asarray(logp_fn(params, seq, am))[:, -tn:] * m
        ref = None
        if reference_params is not None:
            ref = np.asarray(logp_fn(reference_params, seq, am))[:, -tn:] * m
        for name, fn in rerankers.items():
            scores[name].append(fn(lp, ref, m))
        if entropy:
            ents.append(float(token_entropy(policy(seq, am), am.at[:, :-tn].set(0))))

    # the run's scorer: model-written code (rewards.scorer 'auto' for a sandboxed task) runs
    # only in the sandbox
    scorer = make_scorer(sections.reward_options(c), task)
    res = evaluation.evaluate(
        sampler, tokenizer, task, options, on_sampled=on_sampled, scorer=scorer
    )
    prompts = min(options.num_prompts, task.num_examples("eval"))
    out = {"pass@1_greedy": res["eval/pass@1_greedy"], "prompts": float(prompts)}
    if not n:
        return out
    out[f"pass@{n}"] = res[f"eval/pass@{n}"]
    out["mean_correct_sampled"] = res["eval/mean_correct_sampled"]
    correct_pn = np.concatenate(correct).reshape(prompts, n).astype(np.float32)
    for name in rerankers:
        s = np.concatenate(scores[name]).reshape(prompts, n)
        out[f"best_of_{n}/{name}"] = best_of_n(correct_pn, s)
    if entropy:
        out["entropy"] = float(np.mean(ents))
    return out


def table(results: dict[str, float]) -> str:
    width = max(map(len, results))
    return "\n".join(f"{k:<{width}}  {v:.4f}" for k, v in results.items())


def main(argv=None) -> dict[str, float]:
    from absl import flags
    from ml_collections import config_flags

    from jaxrl_frontier.core.errors import ConfigError
    from jaxrl_frontier.data.tasks import task_for
    from jaxrl_frontier.run import config as config_lib
    from jaxrl_frontier.run.build import build_mesh, build_model, build_tokenizer
    from jaxrl_frontier.run.config import sections
    from jaxrl_frontier.run.config.flags import (
        flag_error,
        flags_help,
        import_flag_modules,
        wants_help,
    )

    argv = list(sys.argv if argv is None else argv)
    try:
        import_flag_modules(argv)  # a user's registry entries, before the config file loads
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    f = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config",
        None,
        "Experiment config file FILE.py[:ARG] (then --config.KEY=VALUE overrides).",
        flag_values=f,
        lock_config=False,
        sys_argv=argv,
    )
    flags.DEFINE_string(
        "policy", None, "A workdir (its export/) or an HF directory.", flag_values=f
    )
    flags.DEFINE_string("reference", None, "The reference for --rerank=progress.", flag_values=f)
    flags.DEFINE_integer(
        "n", 8, "Samples per prompt (pass@n, best-of-n); 0: greedy pass@1 alone.", flag_values=f
    )
    flags.DEFINE_string(
        "rerank",
        "confidence,none",
        "Rerankers, comma-separated: " + ", ".join(RERANKERS.names()),
        flag_values=f,
    )
    flags.DEFINE_integer(
        "num_prompts", None, "Held-out prompts (default eval.num_prompts).", flag_values=f
    )
    flags.DEFINE_bool("entropy", False, "Also the mean next-token entropy.", flag_values=f)
    flags.DEFINE_string("json", None, "Write the results here.", flag_values=f)
    if wants_help(argv):
        print(flags_help(f, __doc__))
        return {}
    try:
        f(argv)
        c = None if f.config is None else config_lib.resolve(f.config)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
        raise SystemExit(f"config error: {flag_error(argv, e)}") from None  # one line
    if c is None or not f.policy:
        raise SystemExit("usage: evaluate.py --config=FILE --policy=DIR [--reference=DIR] ...")
    mesh, tokenizer = build_mesh(c), build_tokenizer(c)
    # the run's task: its chat template and prompt-length check (task.chat_template)
    task = task_for(sections.task_options(c), tokenizer)
    load = lambda path: build_model(
        "hf", path, c, tokenizer, mesh, jax.random.key(0), c.model.dtype
    )
    policy = load(f.policy)
    ref = None
    if f.reference:
        from flax import nnx

        ref = nnx.state(load(f.reference))
    results = evaluate_policy(
        c,
        policy,
        tokenizer,
        task,
        mesh=mesh,
        reference_params=ref,
        n=f.n,
        rerank=tuple(x for x in f.rerank.split(",") if x),
        num_prompts=f.num_prompts,
        entropy=f.entropy,
        seed=c.seed,
    )
    print(table(results))
    if f.json:
        with open(f.json, "w") as fh:
            json.dump(dict(policy=f.policy, reference=f.reference, **results), fh, indent=2)
    return results


if __name__ == "__main__":
    from jaxrl_frontier.core import host_memory

    host_memory.restart_with_huge_pages()  # no device is touched before main()
    main()
