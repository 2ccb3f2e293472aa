"""ZPPO's hard-prompt replay source (`data.source = 'zppo'`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_frontier.core.distributed import allgather_json
from jaxrl_frontier.data.tasks.base import Example, Task
from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.sources.base import SOURCES, PromptSource, SourceOptions, UniformSource
from jaxrl_frontier.rl.sources.utils import process_slice


class ZPPOSource(PromptSource):
    """ZPPO's hard-prompt replay ("Zone of Proximal Policy Optimization: Teacher in Prompts,
    Not Gradients"): the teacher's help goes into the prompt, not the gradient.

    A prompt is hard when its group's mean accuracy is < 0.5. It enters a FIFO replay buffer
    (`capacity`; the oldest entry is evicted when full) with the student's wrong answers,
    and each step `replay_fraction` of the batch replays buffer entries (round robin), the
    rest coming from the uniform stream. A replay alternates between

        BCQ: bcq_template(candidates = {one correct reference answer, one wrong student
             answer} in a seeded random order, unlabelled; question)
        NCQ: ncq_template(wrong = the student's wrong answers; question)

    The reference is the teacher's greedy answer to the question when the run has a teacher
    model and that answer is verified correct (`use_teacher`, asked once when the prompt
    enters the buffer, kept in the entry), else the task's own (`task.demonstration`). The
    replayed prompt is
    scored against the original question's answer; when a replay's (or a fresh draw's) group
    accuracy is >= 0.5 the prompt graduates and leaves the buffer. Results are gathered from
    every process (the buffer is the same everywhere); all of it is in `state()`. Metrics:
    `zppo/buffer_size`, `zppo/graduations`, `zppo/evictions` (run totals), `zppo/replayed`,
    and with a teacher `zppo/teacher_references` (admissions whose reference is the
    teacher's, run total).
    """

    wants_teacher_answers = True  # its BCQ references

    def __init__(
        self,
        task: Task,
        fresh: UniformSource,
        *,
        seed: int,
        capacity: int = 64,
        replay_fraction: float = 0.25,
        max_wrong: int = 3,
        bcq_template: str = "{candidates};{question}",
        ncq_template: str = "not {wrong};{question}",
        process_index: int = 0,
        process_count: int = 1,
    ):
        if capacity < 1 or not 0 <= replay_fraction <= 1:
            raise ValueError(
                "config keys 'data.zppo.capacity' (>= 1) and 'data.zppo.replay_fraction' "
                f"(in [0, 1]): got {capacity}, {replay_fraction}"
            )
        self.task, self.fresh, self.seed = task, fresh, int(seed)
        self.capacity, self.replay_fraction, self.max_wrong = capacity, replay_fraction, max_wrong
        self.bcq_template, self.ncq_template = bcq_template, ncq_template
        self.pi, self.pn = process_index, process_count
        self.buffer: list[dict[str, Any]] = []  # FIFO of {index, wrong: [str], replays}
        self.cursor = 0
        self.graduations = self.evictions = 0
        self._replayed = 0
        self.teacher_answers = None  # examples -> [verified teacher answer or None]
        self.teacher_references = 0
        names = tuple(task.reward_names)
        self._correct_col = names.index("correctness") if "correctness" in names else 0

    def context_prompt(self, entry: dict[str, Any]) -> tuple[str, str]:
        """(kind, prompt) of an entry's next replay: BCQ on even replays, NCQ on odd."""
        ex = self.task.example("train", entry["index"])
        question = self.task.prompt(ex)
        if entry["replays"] % 2 == 0:
            rng = np.random.default_rng([self.seed, entry["index"], entry["replays"]])
            reference = entry.get("reference") or self.task.demonstration(ex)
            pair = [reference, entry["wrong"][0]]
            order = rng.permutation(2)
            cands = ",".join(pair[i] for i in order)
            return "bcq", self.bcq_template.format(candidates=cands, question=question)
        wrong = ",".join(entry["wrong"])
        return "ncq", self.ncq_template.format(wrong=wrong, question=question)

    def use_teacher(self, answers) -> None:
        """Take BCQ references from `answers(examples) -> [str | None]` (a
        `teacher_answers.TeacherAnswers`: the teacher's verified greedy answers)."""
        self.teacher_answers = answers

    def next_batch(self) -> list[Example]:
        b = self.fresh.batch_size
        fresh = self.fresh.next_batch()
        n = min(len(self.buffer), int(round(self.replay_fraction * b)))
        replays = []
        for _ in range(n):
            entry = self.buffer[self.cursor % len(self.buffer)]
            self.cursor = (self.cursor + 1) % len(self.buffer)
            kind, prompt = self.context_prompt(entry)
            entry["replays"] += 1
            ex = self.task.example("train", entry["index"])
            replays.append({**ex, "index": entry["index"], "prompt": prompt, "zppo": kind})
        self._replayed = n
        return process_slice(replays + fresh[: b - n], self.pi, self.pn)

    def observe(self, results: Sequence[PromptResult]) -> None:
        mine = []
        for r in results:
            solved = np.asarray(r.rewards)[:, self._correct_col] > 0
            wrong = [t.strip() for t, c in zip(r.texts, solved) if not c and t.strip()]
            mine.append([int(r.index), float(r.correct), wrong[: self.max_wrong]])
        admitted = []
        for index, acc, wrong in (x for part in allgather_json(mine) for x in part):
            at = next((i for i, e in enumerate(self.buffer) if e["index"] == index), None)
            if at is not None:
                if acc >= 0.5:  # graduates
                    del self.buffer[at]
                    self.cursor = self.cursor - 1 if at < self.cursor else self.cursor
                    self.graduations += 1
            elif acc < 0.5 and wrong:
                self.buffer.append(dict(index=index, wrong=wrong, replays=0))
                admitted.append(self.buffer[-1])
                if len(self.buffer) > self.capacity:  # FIFO eviction
                    del self.buffer[0]
                    self.cursor = max(self.cursor - 1, 0)
                    self.evictions += 1
        if self.buffer:
            self.cursor %= len(self.buffer)
        else:
            self.cursor = 0
        if self.teacher_answers is not None and admitted:  # the same list on every process
            examples = [self.task.example("train", e["index"]) for e in admitted]
            for entry, answer in zip(admitted, self.teacher_answers(examples)):
                entry["reference"] = answer
                self.teacher_references += answer is not None

    def metrics(self) -> dict[str, float]:
        return {
            "zppo/buffer_size": float(len(self.buffer)),
            "zppo/graduations": float(self.graduations),
            "zppo/evictions": float(self.evictions),
            "zppo/replayed": float(self._replayed),
            **(
                {"zppo/teacher_references": float(self.teacher_references)}
                if self.teacher_answers is not None
                else {}
            ),
        }

    def state(self) -> dict[str, Any]:
        return {
            "fresh": self.fresh.state(),
            "buffer": [dict(e) for e in self.buffer],
            "cursor": self.cursor,
            "graduations": self.graduations,
            "evictions": self.evictions,
            "teacher_references": self.teacher_references,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.fresh.restore(state["fresh"])
        self.buffer = [dict(e) for e in state["buffer"]]
        self.cursor = int(state["cursor"])
        self.graduations, self.evictions = int(state["graduations"]), int(state["evictions"])
        self.teacher_references = int(state.get("teacher_references", 0))


@SOURCES.register("zppo", part=ZPPOSource)
def zppo(
    task: Task, options: SourceOptions, *, batch_size: int, process_index: int, process_count: int
):
    """`data.source = 'zppo'`: hard-prompt replay with BCQ / NCQ prompts (`data.zppo.*`)."""
    z = options.zppo
    return ZPPOSource(
        task,
        UniformSource(task, batch_size=batch_size, seed=options.seed),  # the global stream
        seed=options.seed,
        capacity=z.capacity,
        replay_fraction=z.replay_fraction,
        max_wrong=z.max_wrong,
        bcq_template=z.bcq_template,
        ncq_template=z.ncq_template,
        process_index=process_index,
        process_count=process_count,
    )
