"""Episode statistics: env steps, finished episodes, and the returns and lengths of the most recent ones
(a window), for one seed and summarised over several."""
from __future__ import annotations

import collections

import numpy as np


def mean(values) -> float:
    """The mean of ``values`` as a float; NaN for none."""
    return float(np.mean(values)) if len(values) else float("nan")


class EpisodeStats:
    """Counters of one seed's training.

    ``env_steps`` (agent steps summed over environments), ``episodes`` finished, ``episodes_nonfinite`` of
    them whose return is NaN or inf (e.g. an env's NaN reward: counted, never averaged), and the returns and
    lengths (agent steps) of the last ``window`` finished episodes with a finite return.
    """

    def __init__(self, window: int):
        self.returns: collections.deque = collections.deque(maxlen=window)
        self.lengths: collections.deque = collections.deque(maxlen=window)  # agent steps per episode
        self.episodes = 0
        self.episodes_nonfinite = 0
        self.env_steps = 0

    def record_episodes(self, episode_return: np.ndarray, finished: np.ndarray, steps: int,
                        episode_length: np.ndarray | None = None) -> None:
        """Add the returns (and lengths, in agent steps) of episodes that finished in a rollout of
        ``steps`` env steps (``[T, B]`` arrays, ``finished`` bool). An episode whose return is not finite
        is counted in ``episodes`` and ``episodes_nonfinite`` but kept out of the returns (and lengths)
        averaged."""
        self.record_steps(steps)
        finished = np.asarray(finished)
        episode_return = np.asarray(episode_return)
        # Time-major order: earlier steps first, so the deque keeps the most recent episodes.
        done_returns = episode_return[finished]
        ok = np.isfinite(done_returns)
        self.returns.extend(done_returns[ok].tolist())
        if episode_length is not None:
            self.lengths.extend(np.asarray(episode_length)[finished][ok].tolist())
        self.episodes += int(done_returns.size)
        self.episodes_nonfinite += int(done_returns.size - np.count_nonzero(ok))

    def record_steps(self, steps: int, episodes: int = 0) -> None:
        """Count ``steps`` env steps and ``episodes`` finished episodes without their returns."""
        self.env_steps += steps
        self.episodes += episodes

    def load(self, state: dict) -> None:
        """Continue from the counters of a Monitor's ``state_dict`` (keys ``env_steps``, ``episodes``,
        ``returns``; ``episodes_nonfinite`` and ``lengths`` where an older checkpoint has none: 0 and [])."""
        self.env_steps = int(state["env_steps"])
        self.episodes = int(state["episodes"])
        self.episodes_nonfinite = int(state.get("episodes_nonfinite", 0))
        self.returns.clear()
        self.returns.extend(state["returns"])
        self.lengths.clear()
        self.lengths.extend(state.get("lengths", []))
