"""Native CPU kernels (C++ XLA FFI custom calls) for hot paths XLA:CPU runs poorly.

Each kernel is a `<name>.cc` file here, compiled on first use by `build.py` for the machine
it runs on, and has a plain-XLA equivalent that is used wherever the kernel is not (other
backends, no compiler, unsupported shapes). Tests check each kernel against that equivalent.

- `decode_attention`: one decode step's grouped-query attention over the KV cache
  (`Sampler(decode_attention=)`, config key `rollout.decode_attention`).
- `decode_matmul`: a decode step's projection matmuls, on weights packed once per rollout
  (`Sampler(decode_matmul=)`, config key `rollout.decode_matmul`).
"""
