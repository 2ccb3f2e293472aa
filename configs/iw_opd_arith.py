"""IW-OPD on 3-digit addition: OPD with prefix-discrepancy importance weights.

    python scripts/train.py --config=configs/iw_opd_arith.py --workdir=runs/iw_opd_arith

IW-OPD (2026): w_t = 1 + gamma * (1 - P_t / S), P_t the accumulated |teacher - student|
discrepancy before t and S its row total: early tokens up-weighted, drifted ones down.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic_opd()
    c.objective.weight = "iw_opd"
    c.objective.weight_kwargs = dict(gamma=0.5)
    return presets.finish(c, arg)
