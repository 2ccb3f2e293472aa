"""The uniform prompt source and the source interface (rl/sources/base.py): one global stream
sliced per process, an exact resume from its JSON state, a resize that batches the rest of the
same stream, the builder by name, and the process-slice helpers (rl/sources/utils.py has its
own file)."""

import json

import pytest

from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.rl.sources.base import PromptSource, SourceOptions, UniformSource, make_source

TASK = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=")


def test_uniform_source_is_one_global_stream_sliced_per_process_and_resumes_exactly():
    one = UniformSource(TASK, batch_size=4, seed=3)
    halves = [
        UniformSource(TASK, batch_size=4, seed=3, process_index=i, process_count=2)
        for i in range(2)
    ]
    for _ in range(3):
        whole = [e["index"] for e in one.next_batch()]
        assert [e["index"] for h in halves for e in h.next_batch()] == whole
    saved = json.loads(json.dumps(one.state()))  # the checkpoint's metadata is JSON
    expected = [[e["index"] for e in one.next_batch()] for _ in range(2)]
    again = UniformSource(TASK, batch_size=4, seed=3)
    again.restore(saved)
    assert [[e["index"] for e in again.next_batch()] for _ in range(2)] == expected
    with pytest.raises(ValueError, match="multiple of the 2 processes"):
        UniformSource(TASK, batch_size=3, seed=0, process_count=2)


def indices(batch):
    return [e["index"] for e in batch]


def test_a_resize_batches_the_rest_of_the_same_stream_and_resumes():
    small = UniformSource(TASK, batch_size=2, seed=5)
    stream = [i for _ in range(6) for i in indices(small.next_batch())]  # 12 prompts
    src = UniformSource(TASK, batch_size=4, seed=5)
    assert indices(src.next_batch()) + indices(src.next_batch()) == stream[:8]
    src.resize(2)
    assert src.batch_size == 2 and indices(src.next_batch()) == stream[8:10]
    saved = json.loads(json.dumps(src.state()))
    again = UniformSource(TASK, batch_size=4, seed=5)
    again.restore(saved)  # the resized batching comes back with the state
    assert again.batch_size == 2 and indices(again.next_batch()) == stream[10:12]
    src.resize(2)  # the same size: nothing changes
    assert indices(src.next_batch()) == stream[10:12]


def test_make_source_builds_by_name_and_the_base_refuses_a_resize():
    options = SourceOptions(name="uniform", seed=5)
    built = make_source(TASK, options, batch_size=4)
    assert indices(built.next_batch()) == indices(
        UniformSource(TASK, batch_size=4, seed=5).next_batch()
    )

    class Fixed(PromptSource):
        pass

    with pytest.raises(NotImplementedError, match="Fixed cannot change its prompt batch"):
        Fixed().resize(8)
