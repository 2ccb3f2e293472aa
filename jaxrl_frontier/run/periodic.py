"""The trainer's periodic work (train/hooks.py) built from a config: the hooks after each
step, in order, and the watchdog of hangs and lost processes.

    WriteMetrics   every train.log_every: the step's scalars to `metrics.writers`
    Progress       process 0's console line, at the same steps
    StopOnSignal   SIGTERM / SIGINT on any process: every process stops after this step
    Evaluate       every train.eval_every (and at step 0 with eval.at_start, RL): greedy
                   pass@1, pass@k; train.stop_at_pass1 and the collapse rule stop the run
    Checkpoint     every train.checkpoint_every, at the last step, whenever the run stops
    Beats          the watchdog's and the workdir lock's after-step beats
    (the step's)   the RL step's stage switch (BetweenSteps)
    AtEnd          the export, with train.export = 'last'
"""

from __future__ import annotations

import jax

from jaxrl_frontier.run.config import sections
from jaxrl_frontier.train import collapse
from jaxrl_frontier.train import hooks as hooks_lib
from jaxrl_frontier.train.metrics import ProgressBar
from jaxrl_frontier.train.watchdog import Watchdog


def hooks(trainer, c) -> list[hooks_lib.Hook]:
    """The hooks of `trainer` (run/trainer.py) for config `c`, in the order they run."""
    tag, t = trainer.step.tag, c.train
    say = lambda msg: trainer.say(f"[{tag}] {msg}")  # noqa: E731
    out: list[hooks_lib.Hook] = [hooks_lib.WriteMetrics(trainer.writer, t.log_every)]
    if trainer.is_main and trainer.shared is None:  # a population: its first member's
        bar = lambda start: ProgressBar(t.steps, initial=start, desc=tag)  # noqa: E731
        out.append(hooks_lib.Progress(bar, t.log_every, trainer.step.shown))
    out += [
        hooks_lib.StopOnSignal(lambda: trainer.stop_request, say),
        hooks_lib.Evaluate(
            lambda: trainer.evaluate(),
            t.eval_every,
            at_start=trainer.step.evaluates_at_start,
            stop_at=t.stop_at_pass1,
            history=trainer.history,
            writer=trainer.writer,
            paused=lambda: trainer.holding("eval"),
            after_eval=lambda ev, step: collapse.after_eval(
                trainer.history,
                ev,
                step,
                sections.peak_options(trainer.config),
                lambda: trainer.export(),
                say,
            ),  # fmt: skip
            say=say,
        ),
        hooks_lib.Checkpoint(trainer.save, trainer.ckpt.wait, t.checkpoint_every),
        hooks_lib.Beats(trainer.watchdog, trainer.lock),
        *trainer.step.hooks(),  # the RL step's stage switch
    ]
    if t.export == "last":  # 'best': written at the best eval
        out.append(hooks_lib.AtEnd(lambda: trainer.export()))
    return out


def watchdog(c, workdir: str) -> Watchdog:
    """The run's watchdog: `train.hang_timeout_s` (0: no hang check), and on several
    processes the lost-process check by `distributed.heartbeat_timeout_s`."""
    return Watchdog(
        workdir,
        hang_timeout_s=c.train.hang_timeout_s,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        heartbeat_timeout_s=c.distributed.heartbeat_timeout_s,
        end_timeout_s=c.distributed.shutdown_timeout_s,
    )
