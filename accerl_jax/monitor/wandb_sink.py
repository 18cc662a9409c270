"""Weights & Biases (``--wandb``): every row, when asked; a failure of W&B never stops training."""
from __future__ import annotations

import os
import sys
import uuid

import numpy as np

from accerl_jax.config import ConfigError


def require_wandb() -> None:
    """Check that Weights & Biases can be imported (before a run asking for it writes anything).

    Raises:
      ConfigError: if ``wandb`` is not installed, saying how to install it.
    """
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("bad --wandb: the wandb package is not installed; pip install wandb (and log in with "
                          "'wandb login', or set WANDB_MODE=offline), or leave out --wandb/--wandb-project") from None


class WandbSink:
    """Logs rows to a W&B run started at the first :meth:`write`, in ``logdir``.

    Args:
      kwargs: keyword arguments of ``wandb.init`` (e.g. ``project``, ``config``).
      logdir: the run folder (W&B's ``dir``, and the run's default name).

    ``id`` names the W&B run (``resume="allow"``): a resumed run sets it to the saved one before its first
    write, so that it continues the same W&B run.
    """

    def __init__(self, kwargs: dict, logdir: str):
        self._kwargs = kwargs
        self._logdir = logdir
        self._run = None
        self.id = uuid.uuid4().hex[:16]

    def write(self, row: dict) -> None:
        if self._kwargs is None:
            return
        try:
            if self._run is None:
                import wandb

                self._run = wandb.init(**{"name": os.path.basename(os.path.normpath(self._logdir)),
                                          **self._kwargs, "dir": self._logdir, "id": self.id, "resume": "allow"})
            # W&B's own step counter, not env steps: a resumed run re-logs updates after its checkpoint, and
            # W&B drops steps lower than one already logged; plot against the env_steps field instead.
            self._run.log({k: v for k, v in row.items() if np.isfinite(v)})
        except Exception as err:  # noqa: BLE001 - W&B (login, network) must never stop training
            print(f"warning: Weights & Biases failed ({type(err).__name__}: {err}); W&B logging is off for the rest "
                  f"of this run; metrics.csv, metrics.jsonl and TensorBoard in {self._logdir} are complete",
                  file=sys.stderr)
            self._kwargs, self._run = None, None

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
