"""models/text.py: prompts left-padded to a fixed width with BOS; completions decoded up to
EOS, special tokens dropped."""

import numpy as np

from jaxrl_frontier.models.text import decode, encode_prompts
from jaxrl_frontier.models.tokenizer import CharTokenizer


def test_prompts_left_padded_to_the_width_and_completions_cut_at_eos():
    tok = CharTokenizer()
    tokens, mask = encode_prompts(tok, ["1+2=", "3="], 6)
    assert tokens.dtype == mask.dtype == np.int32 and tokens.shape == (2, 6)
    assert mask.tolist() == [[0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]]
    assert tokens[:, :3].tolist() == [[tok.pad_id, tok.bos_id] + tok.encode("1"), [tok.pad_id] * 3]
    assert tokens[1, 3:].tolist() == [tok.bos_id] + tok.encode("3=")
    done = tok.encode("12") + [tok.eos_id] + tok.encode("9")
    completions = np.asarray([done, tok.encode("7") + [tok.pad_id] * 3])
    assert decode(tok, completions, np.asarray([[1, 1, 1, 1], [1, 0, 0, 0]])) == ("12", "7")
