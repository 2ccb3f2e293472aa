"""The prompt sources' helpers (rl/sources/utils.py): a process's slice of a global batch, a
generator state through JSON, and the prompt text an example is rolled out on."""

import json

import numpy as np

from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.rl.sources.utils import process_slice, prompt_text, rng_from, rng_state


def test_process_slice_gives_each_process_its_share():
    items = list(range(6))
    assert [process_slice(items, i, 3) for i in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert process_slice(items, 0, 1) == items
    assert process_slice(list(range(7)), 1, 2) == [3, 4, 5]  # the rest of 7 // 2 left out


def test_a_generator_resumes_from_its_json_state():
    rng = np.random.default_rng(3)
    rng.random(5)
    state = json.loads(json.dumps(rng_state(rng)))
    want = rng.random(4)
    np.testing.assert_array_equal(rng_from(state).random(4), want)


def test_prompt_text_is_the_sources_prompt_else_the_tasks():
    task = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=")
    ex = task.example("train", 0)
    assert prompt_text(task, ex) == f"{ex['a']}+{ex['b']}="
    assert prompt_text(task, {**ex, "prompt": "not 3;" + task.prompt(ex)}).startswith("not 3;")
