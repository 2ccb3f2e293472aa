"""Where a decode step's time goes: `python benchmarks/bench.py profile [--config=...]`.

A decode step is a rollout of Tn new tokens minus a 1-token rollout (the prefill), over
Tn - 1 steps, as in the sampler benchmark's roofline. Each of the two warm rollouts runs once
under `jax.profiler.trace`; the Perfetto trace's op events are summed per op name, the
prefill's subtracted, and divided by the steps:

- `per_step`: for each kind of op (a GPU kernel, or an XLA:CPU thunk, without its instance
  number), microseconds and calls per decode step, largest first;
- `busy_us_per_step` against `wall_us_per_step` (untraced, median over rounds): how much of a
  step the device spends in ops at all (summed over lanes: XLA:CPU's threads overlap). On a
  GPU, a step far longer than its kernels is bound by launches and host work, not by the
  kernels; `ops_per_step` counts the launches. On XLA:CPU a dot the Eigen pool runs
  records only its dispatch as an op event, its work runs in pool tasks the op sums miss:
- `matmuls_alone`: the step's weight matmuls and nothing else (every layer's projections
  and the output layer, `[B, in] x [in, out]` as the decode runs them, one program) timed
  in the same rounds as the step, and the weights' bytes over that time: what the matmul
  library alone takes at these rows, against the array-sum bandwidth of the same rounds
  (`bandwidth_gbs`). A step close to its matmuls alone is bound by the matmul library's
  speed at these shapes, not by the ops around them.

    python benchmarks/bench.py profile --config=benchmarks/configs/random_qwen2.py:0.5b \
        --batches 256                                                   # a GPU
    python benchmarks/bench.py profile --batches 64                     # CPU, the tiny model

The trace itself stays in --trace-dir (TensorBoard's profile plugin or ui.perfetto.dev).
"""

from __future__ import annotations

import collections
import functools
import gzip
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import common, sampler


def add_arguments(p) -> None:
    p.add_argument("--batches", type=common.ints, default=[64], help="rows")
    p.add_argument("--new-tokens", type=int, default=32, help="decode length of the traces")
    p.add_argument("--repeats", type=int, default=3, help="untimed rounds of the wall step")
    p.add_argument("--trace-dir", default="", help="keep the traces here (default: a temp dir)")
    p.add_argument("--top", type=int, default=30, help="ops listed per step, largest first")


# XLA:CPU runtime events on the op lanes: an op's end marker, the thread pool's bookkeeping,
# and the executor's wait (not ops themselves).
RUNTIME_EVENTS = ("end: ", "ThreadpoolListener::", "ThunkExecutor::", "SlinkyThreadPool::")


def op_events(trace: dict) -> list[tuple[str, str, float]]:
    """(lane, op name, microseconds) of each leaf op event in a Perfetto/Chrome JSON trace.

    A lane is "process / thread". Op events are complete events ("ph": "X") on a device
    process ("/device:..."), e.g. a GPU stream's kernels; on a CPU-only trace, where XLA's
    thunks run on host threads, those on the host's XLA threads. Python lanes and XLA:CPU's
    runtime events (`RUNTIME_EVENTS`) are left out, and so is every event that encloses
    another op on its lane (XLA:CPU's while loops), so that summed times count each op once.
    """
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    process, thread = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            process[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            thread[(e["pid"], e["tid"])] = e["args"]["name"]
    devices = {pid for pid, name in process.items() if name.startswith("/device:")}
    lanes = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e or e["name"].startswith(RUNTIME_EVENTS):
            continue
        pid, lane_thread = e["pid"], thread.get((e["pid"], e.get("tid")), str(e.get("tid")))
        on_device = pid in devices
        if not devices:  # CPU: XLA's ops are host events on its own threads
            on_device = "xla" in lane_thread.lower() or "tfrt" in lane_thread.lower()
        if on_device:
            lane = f"{process.get(pid, pid)} / {lane_thread}"
            lanes[lane].append((float(e["ts"]), float(e["dur"]), e["name"]))
    out = []
    for lane, spans in lanes.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        for i, (ts, dur, name) in enumerate(spans):
            encloses = i + 1 < len(spans) and spans[i + 1][0] < ts + dur
            if not encloses:
                out.append((lane, name, dur))
    return out


def op_kind(name: str) -> str:
    """An op's name without XLA's instance number: 'ffi_call.1407' and 'loop_fusion_3' ->
    'ffi_call', 'loop_fusion' (a decode step's unrolled copies of one op are one kind)."""
    return re.sub(r"[._]\d+$", "", name)


def load_trace(log_dir: Path) -> dict:
    """The newest `perfetto_trace.json.gz` that `jax.profiler.trace(create_perfetto_trace=True)`
    wrote under log_dir."""
    found = sorted(log_dir.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {log_dir}")
    with gzip.open(found[-1], "rt") as f:
        return json.load(f)


def per_step(full: list, prefill: list, steps: int) -> dict:
    """Op time and calls per step: (full rollout - prefill rollout) / steps, by `op_kind`."""
    totals = collections.defaultdict(lambda: [0.0, 0])
    for sign, events in ((1, full), (-1, prefill)):
        for _, name, us in events:
            totals[op_kind(name)][0] += sign * us
            totals[op_kind(name)][1] += sign
    rows = {
        name: dict(us=us / steps, calls=calls / steps)
        for name, (us, calls) in totals.items()
        if calls > 0 or us > 0
    }
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["us"]))


def profile_model(model, config, batch: int, args) -> dict:
    """Traces of a Tn-token and a 1-token rollout of `model` at `batch` rows -> per-step ops."""
    import jax

    tn = args.new_tokens
    if tn < 2:
        raise ValueError(f"--new-tokens must be >= 2 (one decode step), got {tn}")
    tokens = sampler.prompts(model.cfg.vocab_size, batch, config.data.max_prompt_len)
    full, _ = sampler.rollout(model, config, tokens, tn)
    prefill, _ = sampler.rollout(model, config, tokens, 1)
    matmuls, weight_bytes = matmuls_alone(model, batch)
    bandwidth = sampler.bandwidth_probe()
    t_full, t_prefill, probes = common.decode_step_rounds(
        full, prefill, args.repeats, each_round=lambda: (matmuls(), bandwidth())
    )
    walls = [(f - p) / (tn - 1) for f, p in zip(t_full, t_prefill)]  # untraced step times
    root = Path(args.trace_dir or tempfile.mkdtemp(prefix="jaxrl_profile_"))
    events = {}
    for name, run in (("full", full), ("prefill", prefill)):
        with jax.profiler.trace(str(root / name), create_perfetto_trace=True):
            run()
        events[name] = op_events(load_trace(root / name))
    ops = per_step(events["full"], events["prefill"], tn - 1)
    busy = sum(row["us"] for row in ops.values())
    wall = statistics.median(walls) * 1e6
    alone = statistics.median(m for m, _ in probes)
    return dict(
        batch=batch,
        new_tokens=tn,
        wall_us_per_step=wall,
        busy_us_per_step=busy,
        busy_fraction=busy / wall if wall > 0 else None,
        ops_per_step=sum(row["calls"] for row in ops.values()),
        matmuls_alone=dict(
            us=alone * 1e6,
            share_of_step=alone * 1e6 / wall if wall > 0 else None,
            weight_bytes=weight_bytes,
            weight_gbs=weight_bytes / alone / 1e9,
            bandwidth_gbs=statistics.median(b for _, b in probes) / 1e9,
        ),
        lanes=sorted({lane for lane, _, _ in events["full"]}),
        per_step=dict(list(ops.items())[: args.top]),
        trace_dir=str(root),
    )


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def matmuls_alone(model, batch: int):
    """(run, bytes): run() times one call of a program holding only a decode step's weight
    matmuls at `batch` rows (every layer's `PROJECTIONS` as [in, out] matrices, then the
    output layer as stored, as the decode contracts it), compiled with the decode's options
    at these rows, and returns its seconds (the median of 3 calls); bytes: the weights those
    matmuls read."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_frontier.core.xla_options import rollout_compiler_options
    from jaxrl_frontier.models import model_forms

    dt, d = model.cfg.compute_dtype, model.cfg.hidden_size
    mats = []
    for block in model_forms.unstack_layers(model).layers:
        for path, var in nnx.to_flat_state(nnx.state(block, nnx.Param)):
            if str(path[-1]) in PROJECTIONS:  # [D, ...] in, or [..., D] out
                v = var.get_value()
                mats.append(v.reshape(d, -1) if v.shape[0] == d else v.reshape(-1, d))
    head, vocab_major = model.output_table()
    mats = [m.astype(dt) for m in mats]
    head = head.astype(dt)
    xs = {n: jnp.ones((batch, n), dt) for n in {m.shape[0] for m in mats} | {d}}

    # the decode's own compiler options at these rows (core/xla_options.py: the matmul library)
    options = dict(rollout_compiler_options(jax.default_backend(), batch))

    @functools.partial(jax.jit, compiler_options=options)
    def step(mats, head, xs):
        outs = [xs[m.shape[0]] @ m for m in mats]
        spec = "bd,vd->bv" if vocab_major else "bd,dv->bv"
        return outs, jnp.einsum(spec, xs[d], head, preferred_element_type=jnp.float32)

    call = lambda: jax.block_until_ready(step(mats, head, xs))  # noqa: E731
    call()  # compile
    return lambda: common.median_time(call, 3)[0], sum(m.nbytes for m in mats) + head.nbytes


def bench_profile(args) -> dict:
    """Where a decode step's time goes: a trace's ops per step, against the untraced step."""
    config_args = getattr(args, "config_args", [])
    config = common.load_config(config_args, sampler.DEFAULT_CONFIG)
    model = sampler.build_model(config)
    result = dict(
        **common.machine_info(),
        config_args=config_args or [f"--config={sampler.DEFAULT_CONFIG}"],
        model=common.config_text(config.model),
        checkpoint=(ckpt := common.checkpoint(config)) and {k: ckpt[k] for k in ("path", "sha256")},
        batches={b: profile_model(model, config, b, args) for b in args.batches},
    )
    for batch, row in result["batches"].items():
        top = list(row["per_step"].items())[:5]
        print(
            f"[{batch} rows] {row['wall_us_per_step']:.0f} us/step, ops busy "
            f"{row['busy_us_per_step']:.0f} us in {row['ops_per_step']:.0f} ops; matmuls alone "
            f"{row['matmuls_alone']['us']:.0f} us; top: "
            f"{json.dumps(top)}",
            file=sys.stderr,
        )
    return result
