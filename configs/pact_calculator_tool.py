"""PACT on calculator tool use: GRPO's prompt-only rollouts, plus each problem's expert
trace in the update ("PACT: Privileged Trace Co-Training for Multi-Turn Tool-Use Agents").

    python scripts/train.py --config=configs/pact_calculator_tool.py --workdir=runs/pact_calc
    python scripts/train.py --config=configs/pact_calculator_tool.py:runlocal --workdir=/tmp/x

configs/grpo_calculator_tool.py with `pact.enabled`: the expert (`pact.source =
'calculator'`) calls the tool on the problem's expression, reads the result and answers it.
The rollouts never see it. The update adds the rollout's tokens scored with that trace as a
context after the prompt (pact.trace_coef = 0.5) and an SFT loss on the trace's reasoning
(0.5), tool call (1.0) and answer (1.0) tokens, its coefficient annealed linearly from 0.5
to 0 over 150 steps; the calculator's results are observations (weight 0).
"""

import importlib.util
import os

from jaxrl_frontier.run.config import presets


def _grpo_calculator_tool():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_calculator_tool.py")
    spec = importlib.util.spec_from_file_location("grpo_calculator_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(arg=None):
    c = _grpo_calculator_tool().get_config(None)
    c.pact.update(enabled=True, source="calculator", trace_coef=0.5, sft_coef=0.5)
    c.pact.update(anneal_steps=150, schedule="linear", context_len=96, trace_len=80)
    c.pact.weights = dict(reasoning=0.5, tool_call=1.0, answer=1.0)
    return presets.finish(c, arg)
