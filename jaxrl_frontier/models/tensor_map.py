"""The map between a Hugging Face checkpoint's tensors and the `Transformer`'s parameters
(`tensor_specs`: one `TensorSpec` per HF tensor, in HF's order), read by `hf.load` and
`hf.save`.

Layout conversion (HF Linear weights are [out, in]; ours are [in, out] split into heads):

    q_proj  [H*Dh, D] -> [D, H, Dh]     k_proj, v_proj [K*Dh, D] -> [D, K, Dh]
    o_proj  [D, H*Dh] -> [H, Dh, D]     gate/up [F, D] -> [D, F]   down [D, F] -> [F, D]
    lm_head [V, D]    -> [D, V]         embed [V, D], norms [D], biases [H*Dh] -> [H, Dh]

A layer's tensors (`model.layers.{i}...`) fill one slice of a stacked [L, ...] parameter
(`TensorSpec.layer`); a mixture of experts' `mlp.experts.{e}...` one slice of its [L, E, ...]
parameter (`TensorSpec.expert`). GPT-OSS stores a layer's experts fused instead
(`EXPERT_TENSORS` 'fused'): `mlp.experts.gate_up_proj` [E, D, 2F] already [in, out], its
columns alternating gate, up, gate, up, ...; two specs read that one tensor
(`TensorSpec.interleave`: the gate's columns 0::2, the up's 1::2), and a save writes both
into it (`TensorSpec.write_hf`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_frontier.models.model_config import ModelConfig


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One HF tensor and the parameter it fills.

    linear=True: HF stores [out, in]; ours is the transpose, reshaped to `shape`.
    linear=False: same element order, only reshaped (embeddings, norms, biases).
    layer: for a layer's tensor, its index i along the stacked parameter's leading axis
    (`shape` is then one layer's); None for the embedding, final norm and head.
    expert: for an expert's tensor (`mlp.experts.{e}.*`), its index e along the expert axis
    that follows the layers axis (`shape` is then one expert's); None otherwise.
    interleave: (j, n): the parameter is every n-th column of the HF tensor's last axis from
    column j (`hf[..., j::n]`), another spec holding the others; None: the whole tensor.
    """

    hf_name: str
    path: tuple  # nnx state path, e.g. ("layers", "attn", "q_proj")
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]
    linear: bool
    layer: int | None = None
    expert: int | None = None
    interleave: tuple[int, int] | None = None

    @property
    def index(self) -> tuple[int, ...]:
        """The tensor's place along the parameter's leading (layers[, experts]) axes."""
        # (a per-layer parameter's expert, models/qwen3_5.py: expert alone)
        layer = () if self.layer is None else (self.layer,)
        return layer + (() if self.expert is None else (self.expert,))

    @property
    def part_shape(self) -> tuple[int, ...]:
        """The HF-layout shape of this spec's part of the tensor (`hf_shape` unless
        interleaved: its last axis / n)."""
        if self.interleave is None:
            return self.hf_shape
        return (*self.hf_shape[:-1], self.hf_shape[-1] // self.interleave[1])

    def to_ours(self, w: np.ndarray) -> np.ndarray:
        """HF array -> our layout (a view when possible: no copy of the tensor)."""
        if self.interleave is not None:
            j, n = self.interleave
            w = w[..., j::n]
        return w.T.reshape(self.shape) if self.linear else w.reshape(self.shape)

    def to_hf(self, w: np.ndarray) -> np.ndarray:
        """Our array -> its part of the HF tensor, in HF's layout (`part_shape`)."""
        if self.linear:
            return w.reshape(self.part_shape[::-1]).T
        return w.reshape(self.part_shape)

    def write_hf(self, w: np.ndarray, out: np.ndarray) -> None:
        """Write our array w into `out`, the HF tensor [hf_shape]: all of it, or its
        interleaved columns."""
        if self.interleave is None:
            out[...] = self.to_hf(w)
        else:
            j, n = self.interleave
            out[..., j::n] = self.to_hf(w)


EXPERT_TENSORS = ("per_expert", "fused")  # `Architecture.expert_tensors` (architectures.py)


def hf_tensors(specs: list[TensorSpec]) -> list[tuple[str, list[TensorSpec]]]:
    """The specs grouped by HF tensor, in HF's order: [(name, the specs that fill it)]
    (one spec a tensor, or the interleaved parts of a fused one)."""
    grouped: dict[str, list[TensorSpec]] = {}
    for spec in specs:
        grouped.setdefault(spec.hf_name, []).append(spec)
    return list(grouped.items())


def tensor_specs(cfg: ModelConfig, expert_tensors: str = "per_expert") -> list[TensorSpec]:
    """Every tensor of an HF checkpoint of this config, in HF's order (a fused tensor once a
    part). expert_tensors (`EXPERT_TENSORS`, the architecture's): how the checkpoint names a
    mixture of experts' tensors."""
    d, v = cfg.hidden_size, cfg.vocab_size
    specs = [TensorSpec("model.embed_tokens.weight", ("embed",), (v, d), (v, d), False)]
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        norm = ("layers", "input_norm", "weight")
        layer = [TensorSpec(pre + "input_layernorm.weight", norm, (d,), (d,), False)]
        layer += _attention_specs(cfg, pre)
        layer += [
            TensorSpec(pre + f"{hf_name}.weight", ("layers", ours, "weight"), (d,), (d,), False)
            for hf_name, ours in _mlp_norms(cfg)
        ]
        layer += _mlp_specs(cfg, pre, i, expert_tensors)
        specs += _stacked(cfg, layer, i)
    specs.append(TensorSpec("model.norm.weight", ("final_norm", "weight"), (d,), (d,), False))
    if cfg.num_labels:  # a sequence classifier's score head
        n = cfg.num_labels
        specs.append(TensorSpec("score.weight", ("score",), (n, d), (d, n), True))
    elif not cfg.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", ("lm_head",), (v, d), (d, v), True))
    return specs


def _attention_specs(cfg: ModelConfig, pre: str) -> list[TensorSpec]:
    """One layer's attention tensors: the projections (latent attention's own), their
    biases, the sinks and the q/k norms the config declares."""
    d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
    at, sa = ("layers", "attn"), pre + "self_attn."
    if cfg.kv_lora_rank:
        specs = _latent_attention_specs(cfg, pre)
    else:
        specs = [
            TensorSpec(sa + "q_proj.weight", (*at, "q_proj"), (h * hd, d), (d, h, hd), True),
            TensorSpec(sa + "k_proj.weight", (*at, "k_proj"), (k * hd, d), (d, k, hd), True),
            TensorSpec(sa + "v_proj.weight", (*at, "v_proj"), (k * hd, d), (d, k, hd), True),
            TensorSpec(sa + "o_proj.weight", (*at, "o_proj"), (d, h * hd), (h, hd, d), True),
        ]
    if cfg.qkv_bias:
        specs += [
            TensorSpec(sa + "q_proj.bias", (*at, "q_bias"), (h * hd,), (h, hd), False),
            TensorSpec(sa + "k_proj.bias", (*at, "k_bias"), (k * hd,), (k, hd), False),
            TensorSpec(sa + "v_proj.bias", (*at, "v_bias"), (k * hd,), (k, hd), False),
        ]
    if cfg.o_bias:
        specs.append(TensorSpec(sa + "o_proj.bias", (*at, "o_bias"), (d,), (d,), False))
    if cfg.attention_sinks:
        specs.append(TensorSpec(sa + "sinks", (*at, "sinks"), (h,), (h,), False))
    if cfg.qk_norm:
        specs += [
            TensorSpec(sa + "q_norm.weight", (*at, "q_norm", "weight"), (hd,), (hd,), False),
            TensorSpec(sa + "k_norm.weight", (*at, "k_norm", "weight"), (hd,), (hd,), False),
        ]
    return specs


def _mlp_specs(cfg: ModelConfig, pre: str, i: int, expert_tensors: str) -> list[TensorSpec]:
    """Layer i's MLP tensors: its experts' (an MoE layer), or the dense MLP's (DeepSeek-V3's
    first `first_k_dense_replace` layers are dense)."""
    if cfg.num_experts and i >= cfg.first_k_dense_replace:
        fused = expert_tensors == "fused"
        return _fused_expert_specs(cfg, pre) if fused else expert_specs(cfg, pre)
    d, f, mlp = cfg.hidden_size, cfg.intermediate_size, ("layers", "mlp")
    return [
        TensorSpec(pre + "mlp.gate_proj.weight", (*mlp, "gate_proj"), (f, d), (d, f), True),
        TensorSpec(pre + "mlp.up_proj.weight", (*mlp, "up_proj"), (f, d), (d, f), True),
        TensorSpec(pre + "mlp.down_proj.weight", (*mlp, "down_proj"), (d, f), (f, d), True),
    ]


def _stacked(cfg: ModelConfig, layer: list[TensorSpec], i: int) -> list[TensorSpec]:
    """Layer i's specs at their place in the stacked parameters: index i of `layers`, or,
    with dense first layers (two stacks: `Transformer.dense_layers`, `layers`), its index in
    its own stack."""
    if not cfg.first_k_dense_replace:
        return [dataclasses.replace(spec, layer=i) for spec in layer]
    dense = i < cfg.first_k_dense_replace
    stack, index = ("dense_layers", i) if dense else ("layers", i - cfg.first_k_dense_replace)
    return [dataclasses.replace(s, path=(stack, *s.path[1:]), layer=index) for s in layer]


def _mlp_norms(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(HF name, our Block attribute) of a layer's norms after the attention. Llama / Qwen:
    post_attention_layernorm is the MLP's input norm; Gemma's post_attention_layernorm
    normalises the attention output, pre_feedforward_layernorm is the MLP's input norm
    and post_feedforward_layernorm normalises the MLP output (`ModelConfig.sandwich_norms`)."""
    if not cfg.sandwich_norms:
        return [("post_attention_layernorm", "post_attn_norm")]
    return [
        ("post_attention_layernorm", "attn_out_norm"),
        ("pre_feedforward_layernorm", "post_attn_norm"),
        ("post_feedforward_layernorm", "mlp_out_norm"),
    ]


def _latent_attention_specs(cfg: ModelConfig, pre: str) -> list[TensorSpec]:
    """DeepSeek-V3's attention tensors (`layers.LatentAttention`): q_a_proj [Rq, D],
    q_a_layernorm [Rq], q_b_proj [H (Dn + Dr), D] (or q_proj [H (Dn + Dr), D] without a q
    latent), kv_a_proj_with_mqa [R + Dr, D], kv_a_layernorm [R], kv_b_proj [H (Dn + Dv), R]
    and o_proj [D, H Dv]."""
    d, h, hd, r, rq = (
        cfg.hidden_size, cfg.num_heads, cfg.resolved_head_dim, cfg.kv_lora_rank, cfg.q_lora_rank
    )  # fmt: skip
    dkv, dv, dr = cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.v_head_dim, cfg.qk_rope_head_dim
    at, sa = ("layers", "attn"), pre + "self_attn."
    if rq:
        q = [
            TensorSpec(sa + "q_a_proj.weight", (*at, "q_a_proj"), (rq, d), (d, rq), True),
            TensorSpec(sa + "q_a_layernorm.weight", (*at, "q_a_norm", "weight"), (rq,), (rq,),
                       False),
            TensorSpec(sa + "q_b_proj.weight", (*at, "q_b_proj"), (h * hd, rq), (rq, h, hd), True),
        ]  # fmt: skip
    else:
        q = [TensorSpec(sa + "q_proj.weight", (*at, "q_proj"), (h * hd, d), (d, h, hd), True)]
    return q + [
        TensorSpec(sa + "kv_a_proj_with_mqa.weight", (*at, "kv_a_proj"), (r + dr, d), (d, r + dr),
                   True),
        TensorSpec(sa + "kv_a_layernorm.weight", (*at, "kv_a_norm", "weight"), (r,), (r,), False),
        TensorSpec(sa + "kv_b_proj.weight", (*at, "kv_b_proj"), (h * dkv, r), (r, h, dkv), True),
        TensorSpec(sa + "o_proj.weight", (*at, "o_proj"), (d, h * dv), (h, dv, d), True),
    ]  # fmt: skip


def expert_specs(cfg: ModelConfig, pre: str) -> list[TensorSpec]:
    """An MoE layer's MLP tensors: the router `mlp.gate.weight` [E, D] and, per expert e,
    `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight` (transformers 5 fuses them in
    memory, `gate_up_proj` [E, 2F, D], but reads and writes these names on disk); Qwen2-MoE
    adds `mlp.shared_expert.*_proj.weight` and `mlp.shared_expert_gate.weight` [1, D]."""
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    mlp = ("layers", "mlp")
    specs = [TensorSpec(pre + "mlp.gate.weight", (*mlp, "router"), (e, d), (d, e), True)]
    for j in range(e):
        ex = f"{pre}mlp.experts.{j}."
        specs += [
            TensorSpec(
                ex + "gate_proj.weight", (*mlp, "expert_gate"), (f, d), (d, f), True, None, j
            ),
            TensorSpec(ex + "up_proj.weight", (*mlp, "expert_up"), (f, d), (d, f), True, None, j),
            TensorSpec(
                ex + "down_proj.weight", (*mlp, "expert_down"), (d, f), (f, d), True, None, j
            ),
        ]
    if cfg.router_scoring == "sigmoid":  # DeepSeek-V3's balancing bias
        specs.append(TensorSpec(pre + "mlp.gate.e_score_correction_bias",
                                (*mlp, "router_score_bias"), (e,), (e,), False))  # fmt: skip
    fs = cfg.shared_expert_intermediate_size
    if fs:  # Qwen2-MoE's shared expert and its sigmoid gate; DeepSeek-V3's shared_experts
        sh = pre + ("mlp.shared_expert." if cfg.shared_expert_gated else "mlp.shared_experts.")
        specs += [
            TensorSpec(sh + "gate_proj.weight", (*mlp, "shared_gate"), (fs, d), (d, fs), True),
            TensorSpec(sh + "up_proj.weight", (*mlp, "shared_up"), (fs, d), (d, fs), True),
            TensorSpec(sh + "down_proj.weight", (*mlp, "shared_down"), (d, fs), (fs, d), True),
        ]
        if cfg.shared_expert_gated:
            specs.append(TensorSpec(pre + "mlp.shared_expert_gate.weight",
                                    (*mlp, "shared_expert_gate"), (1, d), (d, 1), True))  # fmt: skip
    return specs


def _fused_expert_specs(cfg: ModelConfig, pre: str) -> list[TensorSpec]:
    """GPT-OSS's MLP tensors: the router `mlp.router.weight` [E, D] and `.bias` [E], and the
    layer's experts fused, already [in, out]: `mlp.experts.gate_up_proj` [E, D, 2F] (gate
    and up columns alternating) with `gate_up_proj_bias` [E, 2F], `down_proj` [E, F, D] with
    `down_proj_bias` [E, D] (transformers' `GptOssExperts`, on disk as in memory)."""
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    mlp, ex = ("layers", "mlp"), pre + "mlp.experts."
    specs = [TensorSpec(pre + "mlp.router.weight", (*mlp, "router"), (e, d), (d, e), True)]
    if cfg.expert_bias:
        specs.append(TensorSpec(pre + "mlp.router.bias", (*mlp, "router_bias"), (e,), (e,), False))
    for j, ours in enumerate(("expert_gate", "expert_up")):
        spec = TensorSpec(ex + "gate_up_proj", (*mlp, ours), (e, d, 2 * f), (e, d, f), False)
        specs.append(dataclasses.replace(spec, interleave=(j, 2)))
    if cfg.expert_bias:
        for j, ours in enumerate(("expert_gate_bias", "expert_up_bias")):
            spec = TensorSpec(ex + "gate_up_proj_bias", (*mlp, ours), (e, 2 * f), (e, f), False)
            specs.append(dataclasses.replace(spec, interleave=(j, 2)))
    specs.append(TensorSpec(ex + "down_proj", (*mlp, "expert_down"), (e, f, d), (e, f, d), False))
    if cfg.expert_bias:
        specs.append(
            TensorSpec(ex + "down_proj_bias", (*mlp, "expert_down_bias"), (e, d), (e, d), False)
        )
    return specs
