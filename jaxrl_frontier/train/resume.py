"""Resume the loop calls: the newest intact checkpoint restored and the JSONL logs cut back
to its step, and the logs flushed before each save, so each step's row appears exactly once
(docs/reliability.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def flush_logs(*loggers) -> None:
    """Flush and fsync the JSONL logs (called before each checkpoint save, so every row up to
    the checkpoint's step is on disk when the checkpoint is)."""
    for logger in loggers:
        if logger is not None:
            logger.flush(sync=True)


def resume(
    ckpt, abstract_state, loggers: Sequence, say: Callable[[str], None], at_most: int | None = None
):
    """(state, meta) of the newest intact checkpoint, or None for a fresh run (whose logs
    are emptied: rows left by a run killed before its first checkpoint are written again).

    Damaged steps are skipped with a warning naming the step and the file; the JSONL logs
    lose the rows written after the restored step (the resumed run writes them again), so
    each step's row appears exactly once. at_most: the steps after it are set aside first
    (`Checkpointer.set_aside_after`) and the run resumes from one no later."""
    if at_most is not None:
        later = ckpt.set_aside_after(at_most)
        if later:
            say(f"checkpoints {later} set aside in {ckpt.directory}.set_aside: resuming at "
                f"step {at_most} or before")  # fmt: skip
    restored = ckpt.restore_latest(abstract_state, warn=lambda m: say(f"warning: {m}"))
    if restored is None:
        # no checkpoint: a run killed before its first one starts over, and so do its logs
        dropped = sum(log.truncate_after(-1) for log in loggers if log is not None)
        if dropped:
            say(
                f"no checkpoint: starting from step 0; dropped {dropped} log rows of a run "
                "killed before its first checkpoint"
            )
        return None
    state, meta, step = restored
    dropped = sum(log.truncate_after(step) for log in loggers if log is not None)
    say(
        f"resumed from step {step} ({ckpt.directory})"
        + (f"; dropped {dropped} log rows written after it" if dropped else "")
    )
    return state, meta
