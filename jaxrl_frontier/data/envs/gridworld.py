"""A multi-agent frozen-lake grid world, in the spirit of MAPF-FrozenLake.

Several agents on a grid of ice with holes each walk to their own goal. Each turn the policy
moves every agent at once (one move word per agent); a move may slip sideways; an agent
that falls into a hole ends the episode as a failure; the episode succeeds when every agent
stands on its goal. From Trainee to Trainer: LLM-Designed Training Environment for RL with
Multi-Agent Reasoning (Chen et al. 2026) introduced MAPF-FrozenLake, whose generator
exposes its configuration knobs so that the training environment itself can be redesigned
between stages; `GridConfig` holds those knobs here.

Rules of one turn:
  - the action text names one move per agent: the LAST `num_agents` words among
    up / down / left / right / stay, in agent order (a, b, c, ...); fewer is an invalid
    action (nothing moves, `invalid_penalty`);
  - with probability `slip_prob` an agent's move (not `stay`) turns into one of the two
    perpendicular moves, each equally likely (FrozenLake's slippery ice);
  - a move off the grid stays put; an agent on its goal stays there;
  - agents moving into the same cell, or swapping cells, are blocked (they stay), and so is
    an agent moving into the cell of one that stays; following one that moves away is fine;
  - then: any agent in a hole -> done, failure; every agent on its goal -> done, success
    (`success_reward`); otherwise `step_penalty`, plus `goal_reward` for each agent that
    reached its goal this turn.

Observation (characters the char tokenizer encodes): the grid, one row per line, with
`.` ice, `o` hole, agents `a`, `b`, ... and their goals `1`, `2`, ... (agent a's goal is 1),
and a line per agent with its position and goal as (row, col).

Reproducible: `reset(seed)` draws the layout from `generate(config, seed)` and seeds the
slips with the same seed, so the same seed and actions give the same episode.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Hashable

from jaxrl_frontier.data.envs.base import ENVS, StepResult, TextEnv

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1), "stay": (0, 0)}
PERPENDICULAR = {
    "up": ("left", "right"),
    "down": ("left", "right"),
    "left": ("up", "down"),
    "right": ("up", "down"),
}
AGENT_NAMES = "abcdefghi"


@dataclasses.dataclass(frozen=True)
class GridConfig:
    """The generator's knobs.

    size: the grid is size x size.
    num_agents: agents (1..9), each with its own start and goal.
    hole_density: probability that a cell (other than starts and goals) is a hole.
    slip_prob: probability that a move slips to a perpendicular one.
    min_goal_distance: each goal at least this many moves (shortest path around the
      holes) from its agent's start.
    solvable: every agent has a path from start to goal around the holes (other agents
      and slips ignored); layouts are redrawn until it holds.
    corners: the classic FrozenLake board: one agent starts at the top-left cell and its
      goal is the bottom-right one (only the holes vary by seed); False: both drawn.
    success_reward, goal_reward, step_penalty, invalid_penalty: the rewards (module docstring).
    """

    size: int = 4
    num_agents: int = 1
    hole_density: float = 0.2
    slip_prob: float = 0.0
    min_goal_distance: int = 2
    solvable: bool = True
    corners: bool = False
    success_reward: float = 1.0
    goal_reward: float = 0.0
    step_penalty: float = 0.0
    invalid_penalty: float = 0.0

    def __post_init__(self):
        if self.size < 2:
            raise ValueError(f"gridworld: size must be >= 2, got {self.size}")
        if not 1 <= self.num_agents <= len(AGENT_NAMES):
            raise ValueError(f"gridworld: num_agents must be in [1, 9], got {self.num_agents}")
        if 2 * self.num_agents > self.size * self.size:
            raise ValueError(
                f"gridworld: {self.num_agents} agents need {2 * self.num_agents} cells; "
                f"the {self.size}x{self.size} grid has {self.size * self.size}"
            )
        if not 0.0 <= self.hole_density < 1.0:
            raise ValueError(f"gridworld: hole_density must be in [0, 1), got {self.hole_density}")
        if not 0.0 <= self.slip_prob <= 1.0:
            raise ValueError(f"gridworld: slip_prob must be in [0, 1], got {self.slip_prob}")
        if self.corners and self.num_agents != 1:
            raise ValueError(f"gridworld: corners needs num_agents = 1, got {self.num_agents}")
        if self.min_goal_distance < 1:
            raise ValueError(
                f"gridworld: min_goal_distance must be >= 1, got {self.min_goal_distance}"
            )


Cell = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Layout:
    """A generated board: holes, and per agent its start and goal."""

    size: int
    holes: frozenset[Cell]
    starts: tuple[Cell, ...]
    goals: tuple[Cell, ...]


def shortest_path(size: int, holes: frozenset[Cell], start: Cell, goal: Cell) -> int | None:
    """Moves from start to goal around the holes (BFS), None if unreachable."""
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        cell, d = queue.popleft()
        if cell == goal:
            return d
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in holes and nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, d + 1))
    return None


# A config no seed can satisfy (min_goal_distance beyond the grid) is an error after this many
# redraws, not an endless loop.
MAX_DRAWS = 1000


def generate(config: GridConfig, seed: int) -> Layout:
    """The layout of `seed` under `config` (deterministic in both)."""
    n = config.size
    cells = [(r, c) for r in range(n) for c in range(n)]
    for draw in range(MAX_DRAWS):
        rng = random.Random(f"gridworld|{seed}|{draw}")
        picked = rng.sample(cells, 2 * config.num_agents)
        if config.corners:
            picked = [(0, 0), (n - 1, n - 1)]
        starts, goals = tuple(picked[::2]), tuple(picked[1::2])
        fixed = set(picked)
        holes = frozenset(
            cell for cell in cells if cell not in fixed and rng.random() < config.hole_density
        )
        ok = True
        for s, g in zip(starts, goals):
            d = shortest_path(n, holes if config.solvable else frozenset(), s, g)
            if d is None or d < config.min_goal_distance:
                ok = False
                break
        if ok:
            return Layout(n, holes, starts, goals)
    raise ValueError(
        f"gridworld: no layout in {MAX_DRAWS} draws for {config} (lower min_goal_distance or "
        "hole_density)"
    )


def parse_moves(action: str, num_agents: int) -> list[str] | None:
    """The last `num_agents` move words of `action`, or None if it has fewer."""
    words = [w.strip(".,;:!?()") for w in action.lower().split()]
    moves = [w for w in words if w in MOVES]
    return moves[-num_agents:] if len(moves) >= num_agents else None


@ENVS.register("gridworld")
class GridWorld(TextEnv):
    """The grid world (module docstring); keyword arguments are `GridConfig`'s fields."""

    name = "gridworld"

    def __init__(self, **config):
        super().__init__()
        self.config = GridConfig(**config)
        self.layout: Layout | None = None
        self.positions: tuple[Cell, ...] = ()
        self.seed = 0
        self._rng = random.Random(0)

    def _reset(self, seed: int) -> str:
        self.seed = seed
        self.layout = generate(self.config, seed)
        self.positions = self.layout.starts
        self._rng = random.Random(f"gridworld-slip|{seed}")
        return self.render()

    def state_key(self) -> Hashable:
        # the layout's seed too: equal positions on two different boards are different states
        return (self.seed, self.positions)

    def render(self) -> str:
        lay = self.layout
        grid = [
            ["o" if (r, c) in lay.holes else "." for c in range(lay.size)] for r in range(lay.size)
        ]
        for k, (r, c) in enumerate(lay.goals):
            grid[r][c] = str(k + 1)
        for k, (r, c) in enumerate(self.positions):
            grid[r][c] = AGENT_NAMES[k]  # an agent on its goal hides the goal's digit
        lines = ["".join(row) for row in grid]
        for k, (pos, goal) in enumerate(zip(self.positions, lay.goals)):
            lines.append(f"{AGENT_NAMES[k]} at ({pos[0]}, {pos[1]}) goal ({goal[0]}, {goal[1]})")
        return "\n".join(lines) + "\n"

    def _slip(self, move: str) -> str:
        cfg = self.config
        if move == "stay" or cfg.slip_prob == 0.0:
            return move
        # draw both numbers every time so one agent's slip never shifts another's
        u, side = self._rng.random(), self._rng.randrange(2)
        return PERPENDICULAR[move][side] if u < cfg.slip_prob else move

    def _step(self, action: str) -> StepResult:
        cfg, lay = self.config, self.layout
        moves = parse_moves(action, cfg.num_agents)
        if moves is None:
            info = {"success": False, "invalid": True, "state": self.state_key(), "moves": None}
            return self.render(), cfg.invalid_penalty, False, info
        moves = [self._slip(m) for m in moves]
        old = self.positions
        target = []
        for pos, goal, move in zip(old, lay.goals, moves):
            if pos == goal:
                target.append(pos)
                continue
            dr, dc = MOVES[move]
            r, c = pos[0] + dr, pos[1] + dc
            target.append((r, c) if 0 <= r < lay.size and 0 <= c < lay.size else pos)
        target = self._resolve_conflicts(old, target)
        self.positions = tuple(target)
        reached = sum(p == g and o != g for p, o, g in zip(target, old, lay.goals))
        fell = any(p in lay.holes for p in target)
        success = not fell and all(p == g for p, g in zip(target, lay.goals))
        reward = cfg.step_penalty + cfg.goal_reward * reached
        if success:
            reward += cfg.success_reward
        info = {
            "success": success,
            "invalid": False,
            "fell": fell,
            "state": self.state_key(),
            "moves": moves,
        }
        return self.render(), reward, fell or success, info

    @staticmethod
    def _resolve_conflicts(old: tuple[Cell, ...], target: list[Cell]) -> list[Cell]:
        """Agents aiming at one cell, or swapping, stay; repeated until no conflict is left
        (a blocked agent may block the one moving into its cell)."""
        target = list(target)
        while True:
            blocked = set()
            for i in range(len(target)):
                for j in range(i + 1, len(target)):
                    if target[i] == target[j] or (target[i] == old[j] and target[j] == old[i]):
                        blocked.update((i, j))
            blocked = {i for i in blocked if target[i] != old[i]}
            if not blocked:
                return target
            for i in blocked:
                target[i] = old[i]


def layout_statistics(config: GridConfig | dict, seeds) -> dict[str, float]:
    """What the layouts of `config` look like over `seeds` (for an environment designer
    choosing the next configuration): mean holes, mean and max shortest start-goal distance."""
    cfg = config if isinstance(config, GridConfig) else GridConfig(**config)
    holes, dists = [], []
    for seed in seeds:
        lay = generate(cfg, seed)
        holes.append(len(lay.holes))
        for s, g in zip(lay.starts, lay.goals):
            d = shortest_path(cfg.size, lay.holes, s, g)
            dists.append(float("inf") if d is None else d)
    return {
        "holes_mean": sum(holes) / len(holes),
        "distance_mean": sum(dists) / len(dists),
        "distance_max": max(dists),
    }


def random_policy_success(
    config: GridConfig | dict, *, episodes: int = 200, max_turns: int = 8, seed: int = 0
) -> float:
    """Success rate of a uniformly random policy (a move per agent from up/down/left/right),
    over `episodes` layouts (seeds seed .. seed+episodes-1) with `max_turns` turns each: the
    floor a trained policy is compared against."""
    cfg = config if isinstance(config, GridConfig) else GridConfig(**config)
    env = GridWorld(**dataclasses.asdict(cfg))
    rng = random.Random(f"random-policy|{seed}")
    wins = 0
    for e in range(episodes):
        env.reset(seed + e)
        for _ in range(max_turns):
            action = " ".join(
                rng.choice(("up", "down", "left", "right")) for _ in range(cfg.num_agents)
            )
            _, _, done, info = env.step(action)
            if done:
                wins += bool(info["success"])
                break
    return wins / episodes
