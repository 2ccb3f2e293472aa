"""benchmarks/decode_profile.py: op events from a Perfetto trace, and the per-step subtraction."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import decode_profile as bench_profile


def _meta(kind, pid, name, tid=None):
    e = dict(ph="M", name=kind, pid=pid, args=dict(name=name))
    if tid is not None:
        e["tid"] = tid
    return e


def test_op_events_keep_device_lanes_only():
    trace = dict(
        traceEvents=[
            _meta("process_name", 1, "/device:GPU:0"),
            _meta("thread_name", 1, "Stream #7", tid=7),
            _meta("process_name", 2, "/host:CPU"),
            _meta("thread_name", 2, "python", tid=3),
            dict(ph="X", pid=1, tid=7, name="gemm_fusion", ts=0, dur=12.5),
            dict(ph="X", pid=1, tid=7, name="loop_fusion", ts=20, dur=2.0),
            dict(ph="X", pid=2, tid=3, name="PjitFunction(run)", ts=0, dur=900.0),
            dict(ph="i", pid=1, tid=7, name="marker", ts=5),
        ]
    )
    assert bench_profile.op_events(trace) == [
        ("/device:GPU:0 / Stream #7", "gemm_fusion", 12.5),
        ("/device:GPU:0 / Stream #7", "loop_fusion", 2.0),
    ]


def test_per_step_subtracts_the_prefill_and_divides_by_steps():
    lane = "/device:GPU:0 / Stream #7"
    full = [(lane, "gemm", 10.0)] * 9 + [(lane, "prefill_attn", 50.0), (lane, "sample", 4.0)] * 1
    full += [(lane, "sample", 4.0)] * 2
    prefill = [(lane, "gemm", 10.0), (lane, "prefill_attn", 50.0), (lane, "sample", 4.0)]
    ops = bench_profile.per_step(full, prefill, steps=2)
    # gemm: (90 - 10) / 2 = 40 us in 4 calls a step; sample: (12 - 4) / 2; the prefill's own
    # op cancels out and is dropped.
    assert ops == {"gemm": dict(us=40.0, calls=4.0), "sample": dict(us=4.0, calls=1.0)}
    assert list(ops) == ["gemm", "sample"]  # largest first


def test_a_real_cpu_trace_has_xla_ops(tmp_path):
    """On XLA:CPU the jitted program's ops appear on the host's XLA threads."""
    f = jax.jit(lambda x: jnp.tanh(x @ x) + 1.0)
    x = jnp.ones((64, 64))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        f(x).block_until_ready()
    events = bench_profile.op_events(bench_profile.load_trace(tmp_path))
    assert events, "no op events found in the CPU trace"
    assert all(us >= 0 for _, _, us in events)
    names = " ".join(name for _, name, _ in events).lower()
    assert "dot" in names or "fusion" in names or "tanh" in names, names[:500]


def test_missing_trace_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        bench_profile.load_trace(tmp_path)


def test_matmuls_alone_reads_every_projection_and_the_output_layer_once(tiny_model_args):
    """The matmuls-alone program of a 2-layer model (D 32, 2 heads of 16, 1 KV head, F 64,
    V 64): per layer q, o 32 x 32, k, v 32 x 16, gate, up, down 32 x 64 (9,216 weights; the
    q/k/v biases are no matmul), and the 32 x 64 output layer: 2 x 9,216 + 2,048 f32
    weights, 81,920 bytes."""
    from benchmarks import common, sampler

    config = common.load_config(tiny_model_args, sampler.DEFAULT_CONFIG)
    run, weight_bytes = bench_profile.matmuls_alone(sampler.build_model(config), batch=3)
    assert weight_bytes == (2 * 9216 + 2048) * 4
    assert run() > 0


def test_the_profile_row_names_the_matmuls_alone_against_the_bandwidth():
    from benchmarks import targets

    row = dict(
        busy_us_per_step=15_000.0, wall_us_per_step=60_000.0, ops_per_step=700.0,
        busy_fraction=0.25, per_step={"ynn_fusion.3": dict(us=9_000.0, calls=30.0)},
        matmuls_alone=dict(us=45_000.0, share_of_step=0.75, weight_gbs=12.0, bandwidth_gbs=27.0),
    )  # fmt: skip
    result = dict(benchmark="profile", batches={"8": row}, model=dict(path="m"))
    (out,) = targets.targets({"p.json": result})
    assert out.measured == (
        "ops 15,000 us of a 60,000 us step, 700 ops; largest `ynn_fusion.3` 9,000 us; the "
        "weight matmuls alone 45,000 us (75% of the step), the weights read at 12.0 of the "
        "array sum's 27.0 GB/s"
    )
