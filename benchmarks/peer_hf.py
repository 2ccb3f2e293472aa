"""The transformers side of the sampler benchmark, in its own process (benchmarks/peers.py).

Request (JSON on stdin): hf_dir, prompts {rows: [[token id, ...], ...]}, repeats, threads,
dtype (ours' compute dtype), prompt_len, new_tokens, temperature, top_k, top_p, min_p.
`generate` samples (do_sample) at those settings with min_new_tokens = max_new_tokens (no
EOS stop: the same work as ours), on the GPU when torch sees one. Median over repeats after one warm-up call.
"""

from __future__ import annotations

import sys


def time_generate(request: dict) -> dict:
    import torch
    import transformers

    from benchmarks import common

    torch.set_num_threads(request["threads"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, request["dtype"])
    model = transformers.AutoModelForCausalLM.from_pretrained(request["hf_dir"], dtype=dtype)
    model = model.to(device).eval()
    n = request["new_tokens"]
    kwargs = dict(
        do_sample=True,
        temperature=request["temperature"],
        top_k=request["top_k"],
        top_p=request["top_p"],
        min_p=request["min_p"] or None,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=0,
    )
    batches = {}
    for rows, tokens in request["prompts"].items():
        input_ids = torch.as_tensor(tokens, dtype=torch.long, device=device)
        mask = torch.ones_like(input_ids)

        def run(input_ids=input_ids, mask=mask):
            with torch.inference_mode():
                out = model.generate(input_ids, attention_mask=mask, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            return out

        assert run().shape == (int(rows), len(tokens[0]) + n)  # warm-up
        median, times = common.median_time(run, request["repeats"])
        batches[rows] = dict(
            seconds=median,
            tokens_per_s=int(rows) * n / median,
            best_tokens_per_s=int(rows) * n / min(times),
            times=times,
        )
        print(f"[transformers threads={request['threads']}] {rows} rows", file=sys.stderr)
    return dict(
        torch_threads=torch.get_num_threads(),
        device=device,
        dtype=request["dtype"],
        batches=batches,
    )


if __name__ == "__main__":
    from benchmarks import peers

    peers.child_main(time_generate, peers.TORCH_SIDE)
