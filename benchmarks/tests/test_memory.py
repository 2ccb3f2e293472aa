"""benchmarks/memory.py through the dispatcher: the Learner's update compiled on 2 fake
devices for the tiny model, its per-device bytes against the hand count."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# random_qwen2:tiny's shape as a tied Llama: V 512, D 256, F 768, 4 layers, 8 / 2 heads of 32
V, D, F, L, HEAD, KV = 512, 256, 768, 4, 32, 2
LAYER = D * D * 2 + 2 * D * KV * HEAD + 3 * D * F + 2 * D  # q, o; k, v; the MLP; two norms
PARAMS = V * D + L * LAYER + D  # tied embedding, the layers, the final norm
NORMS = (2 * L + 1) * D  # 1-D weights: replicated, every other weight split over fsdp


def test_update_bytes_per_device_by_hand(tmp_path):
    out = tmp_path / "memory.json"
    cmd = [sys.executable, "benchmarks/bench.py", "memory", "--model", "tiny", "--devices", "2",
           "--rows", "4", "--seq", "16", "--prompt-len", "8", "--group-size", "2",
           "--no-compare", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    row = result["fsdp_2"]
    assert result["benchmark"] == "memory" and result["devices"] == 2
    assert row["params"] == PARAMS == 3_148_032 and row["mesh"] == dict(
        data=1, fsdp=2, sequence=1, tensor=1
    )
    # f32 parameters: half of each split weight, every norm whole
    assert row["params_bytes"] == 4 * (PARAMS - NORMS) // 2 + 4 * NORMS
    # AdamW's two moments placed like the parameters, plus two int32 step counts
    assert row["opt_state_bytes"] == 2 * row["params_bytes"] + 8
    update = row["programs"]["update"]
    state = row["total_bytes"] + 16  # + step, the rng key (2 x uint32), skipped
    # the arguments: the state and this device's 2 rows x 16 of the five update fields
    assert update["arguments"] == state + 2 * 16 * 4 * 5
    assert update["aliased"] == state  # the whole state donated
    assert update["peak"] == (
        update["arguments"] + update["temporaries"] + update["outputs"] - update["aliased"]
    )
    assert row["estimate"]["params"] == 4 * PARAMS // 2  # the arithmetic splits the norms too
    assert "1_device" not in result
