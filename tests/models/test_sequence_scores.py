"""Sequence classifiers (a reward model's body and score head: `ModelConfig.num_labels`,
`Transformer.sequence_scores`) against transformers' `AutoModelForSequenceClassification`
on the same tiny random checkpoints, rows padded on the left and on the right; and the
checkpoint written back loads in transformers with the same scores."""

import numpy as np
import pytest
from conftest import TINY, hf_logits, redrawn

from jaxrl_frontier.models import hf

PAD = 0
CASES = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        ),
    ),
}
REL_TOL = 1e-5  # max |ours - transformers| / max |score|, f32 sums over 64-wide rows


def build_classifier(case: str, num_labels: int = 2):
    """A random tiny transformers sequence classifier (eval, f32, eager attention), every
    parameter redrawn (norms around 1) so each one moves the scores."""
    import transformers

    cls_name, extra = CASES[case]
    config = getattr(transformers, cls_name)(
        **{**TINY, **extra}, num_labels=num_labels, pad_token_id=PAD, attn_implementation="eager"
    )
    return redrawn(transformers.AutoModelForSequenceClassification.from_config(config).eval(), 0.1)


def padded_rows(side: str):
    """(tokens, mask) [4, 10]: real tokens never the pad id (transformers pools at the last
    token that is not the pad), each row with its own padding on `side`."""
    rng = np.random.RandomState(1)
    lengths = [10, 7, 4, 1]
    tokens = rng.randint(1, TINY["vocab_size"], size=(4, 10)).astype(np.int32)
    mask = np.array([[1] * n + [0] * (10 - n) for n in lengths], np.int32)
    if side == "left":
        mask = mask[:, ::-1].copy()
    return tokens * mask, mask


@pytest.mark.parametrize("case", sorted(CASES))
def test_scores_equal_transformers_with_padding_on_either_side(case, tmp_path):
    import transformers

    torch_model = build_classifier(case)
    torch_model.save_pretrained(tmp_path / "hf")
    model = hf.load(tmp_path / "hf")
    assert model.cfg.num_labels == 2 and not hasattr(model, "lm_head")
    for side in ("left", "right"):
        tokens, mask = padded_rows(side)
        want = hf_logits(torch_model, tokens, mask)  # [B, 2], our positions
        got = np.asarray(model.sequence_scores(tokens, mask))
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= REL_TOL * scale, (case, side)

    # written back (the original config.json's other keys kept: the pad id its pooling reads)
    hf.save(model, tmp_path / "ours", base_config=torch_model.config.to_dict())
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "ours", attn_implementation="eager"
    ).eval()
    tokens, mask = padded_rows("right")
    np.testing.assert_allclose(
        hf_logits(reloaded, tokens, mask), hf_logits(torch_model, tokens, mask), rtol=0, atol=0
    )
