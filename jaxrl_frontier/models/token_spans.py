"""Where each token's text lies in a decoded string, and the map from one tokenization of a
text to another's (a teacher with another tokenizer than the student's: rl/produce/passes.py,
`cross_tokenizer_teacher_pass`).

    ends(ids)[i] = the characters of decode(ids) that the tokens ids[: i + 1] have written:
                   the longest common prefix of decode(ids[: i + 1]) and decode(ids)
                   (a token that ends inside a multi-byte character writes a replacement
                   character there, so the character counts for the token that completes it)
    token i spans (ends[i - 1], ends[i]]  (empty for a token that writes no character yet)

    owner(j) = the student token whose span holds the last character of teacher token j
               (a teacher token of no characters: the owner of the one before it, else the
               first student token)
    teacher_logp[i] = sum over the teacher tokens j with owner(j) = i of logp_teacher[j]

Every teacher token lands on exactly one student token, so a completion's summed teacher
log-probability is kept whole: a student token whose text the teacher writes as part of a
longer token that ends later receives 0, and the student token where that teacher token ends
receives its whole log-probability.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np


def ends(tokenizer, ids: Sequence[int]) -> np.ndarray:
    """[n] int: the characters of decode(ids) written by ids[: i + 1] (module docstring)."""
    full = tokenizer.decode(list(ids), skip_special=True)
    out, last = np.zeros(len(ids), np.int64), 0
    for i in range(len(ids)):
        prefix = tokenizer.decode(list(ids[: i + 1]), skip_special=True)
        last = max(last, len(os.path.commonprefix([prefix, full])))
        out[i] = last
    return out


def owners(student_ends: np.ndarray, teacher_ends: np.ndarray) -> np.ndarray:
    """[m] int: for each teacher token, the student token that owns it (module docstring);
    both tokenizations of the same text (their `ends`)."""
    out = np.zeros(len(teacher_ends), np.int64)
    start = 0
    for j, end in enumerate(teacher_ends):
        if end == start:  # no characters: with the token before it
            out[j] = out[j - 1] if j else 0
            continue
        # the first student token whose written text reaches the teacher token's last char
        out[j] = min(int(np.searchsorted(student_ends, end, side="left")), len(student_ends) - 1)
        start = end
    return out


def to_student_tokens(logp_teacher: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """[n]: each student token's teacher log-probability, the sum over the teacher tokens it
    owns (`owners`)."""
    out = np.zeros(n, np.float64)
    np.add.at(out, owner, np.asarray(logp_teacher, np.float64))
    return out.astype(np.float32)
