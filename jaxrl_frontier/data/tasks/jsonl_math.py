"""`jsonl_math`: math word problems from a user's JSONL file (GSM8K layout by default).

Each line is a JSON object with a prompt field and an answer field (names configurable). The
answer field may be a bare answer ("72"), or a worked solution ending in "#### 72" or holding
"\\boxed{72}"; the reference answer is extracted and normalised (`data/tasks/math_answer.py`).
A worked solution doubles as the SFT demonstration; a bare answer becomes "#### 72".

Rewards: `format` = the completion marks an answer (\\boxed{...} or #### ...); `correctness` =
the marked answer, normalised, equals the reference. The file is read and validated when the
task is built: a bad line is an error naming the file, the 1-based line and what is wrong.

Splits: `eval_path` names a separate eval file; without it, a row is eval iff a stable hash of
its question falls below `eval_fraction` (so the split survives reordering the file).
"""

from __future__ import annotations

from pathlib import Path

from jaxrl_frontier.data.tasks.base import (
    TASKS,
    Example,
    Task,
    check_split,
    hash_unit,
    read_jsonl,
    reward_vector,
)
from jaxrl_frontier.data.tasks.math_answer import extract_answer, normalize_answer

# The small grade-school sample committed with the repo (lowercase, so CharTokenizer encodes it).
SAMPLE_MATH_PATH = Path(__file__).resolve().parents[3] / "data" / "sample_math.jsonl"


def read_jsonl_rows(path: str | Path, prompt_field: str, answer_field: str) -> list[Example]:
    """Rows of `path` as examples {question, answer (normalised), solution, line}.

    Blank lines are skipped. Raises ValueError naming `path:line` for invalid JSON, a non-object
    line, a missing or non-string field, or an answer field with no extractable answer.
    """
    rows = []
    for line, where, obj in read_jsonl(path, "jsonl_math"):
        for field in (prompt_field, answer_field):
            if field not in obj:
                raise ValueError(
                    f"{where}: missing field {field!r} (fields present: {', '.join(obj)}); "
                    f"set prompt_field / answer_field to match the file"
                )
        question, solution = obj[prompt_field], obj[answer_field]
        if isinstance(solution, int | float) and not isinstance(solution, bool):
            solution = str(solution)
        for field, value in ((prompt_field, question), (answer_field, solution)):
            if not isinstance(value, str):
                raise ValueError(
                    f"{where}: field {field!r} must be a string, got {type(value).__name__}"
                )
        marked = extract_answer(solution)
        answer = normalize_answer(marked if marked is not None else solution)
        if not answer:
            raise ValueError(f"{where}: field {answer_field!r} holds no answer: {solution!r}")
        rows.append({"question": question, "answer": answer, "solution": solution, "line": line})
    return rows


@TASKS.register("jsonl_math")
class JsonlMath(Task):
    """Math word problems from JSONL.

    Args:
      path: the JSONL file (train rows, and eval rows unless `eval_path` is given).
      eval_path: optional separate eval file.
      prompt_field, answer_field: the JSON keys (GSM8K: "question", "answer").
      eval_fraction: share of `path`'s rows hashed into eval when there is no eval_path.
      prompt_template: formatted with question.
      max_completion_chars: the length reward's scale.
      seed: unused (the file fixes the examples); accepted so every task takes one.
    Example fields: question, answer (normalised), solution (raw answer field), line, index.
    """

    name = "jsonl_math"

    def __init__(
        self,
        *,
        path: str | Path,
        eval_path: str | Path | None = None,
        prompt_field: str = "question",
        answer_field: str = "answer",
        eval_fraction: float = 0.1,
        prompt_template: str = "{question}\n",
        max_completion_chars: int = 1024,
        seed: int = 0,
    ):
        if eval_path is None and not 0.0 <= eval_fraction < 1.0:
            raise ValueError(f"jsonl_math: eval_fraction must be in [0, 1), got {eval_fraction}")
        if max_completion_chars < 1:
            raise ValueError(
                f"jsonl_math: max_completion_chars must be >= 1, got {max_completion_chars}"
            )
        self.path = Path(path)
        self.prompt_template = prompt_template
        self.max_completion_chars = max_completion_chars
        self.seed = seed
        rows = read_jsonl_rows(path, prompt_field, answer_field)
        if eval_path is not None:
            self._rows = {
                "train": rows,
                "eval": read_jsonl_rows(eval_path, prompt_field, answer_field),
            }
            self._files = {"train": self.path, "eval": Path(eval_path)}
        else:
            is_eval = [hash_unit(f"{self.name}|{r['question']}") < eval_fraction for r in rows]
            self._rows = {
                "train": [r for r, e in zip(rows, is_eval, strict=True) if not e],
                "eval": [r for r, e in zip(rows, is_eval, strict=True) if e],
            }
            self._files = {"train": self.path, "eval": self.path}

    def num_examples(self, split: str) -> int:
        return len(self._rows[check_split(split)])

    def example(self, split: str, index: int) -> Example:
        rows = self._rows[check_split(split)]
        if not 0 <= int(index) < len(rows):
            raise IndexError(
                f"jsonl_math: index {index} outside [0, {len(rows)}) of {split} "
                f"({self._files[split]})"
            )
        return {**rows[int(index)], "index": int(index)}

    def prompt(self, example: Example) -> str:
        return self.prompt_template.format(question=example["question"])

    def demonstration(self, example: Example) -> str:
        solution = example["solution"]
        if extract_answer(solution) is not None:
            return solution
        return f"#### {solution.strip()}"

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        marked = extract_answer(completion)
        correct = marked is not None and normalize_answer(marked) == example["answer"]
        return reward_vector(correct, marked is not None, completion, self.max_completion_chars)

    def __repr__(self) -> str:
        sizes = ", ".join(
            f"{k}={self.num_examples(k)} rows from {v}" for k, v in self._files.items()
        )
        return f"JsonlMath({sizes})"
