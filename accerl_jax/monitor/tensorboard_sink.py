"""TensorBoard event files (tensorboardX): every row's scalars against env steps, grouped by tag."""
from __future__ import annotations

import time

import numpy as np

# TensorBoard groups (CleanRL-style namespaces): a row key's tag is "<group>/<key>"; keys not listed: "train/".
TENSORBOARD_GROUPS = {
    "charts": ("return_mean", "length_mean", "episodes", "env_steps", "steps_per_s", "wall_time_s"),
    "losses": ("loss", "pg_loss", "value_loss", "entropy", "vs_mean", "grad_norm", "learning_rate", "skipped_updates"),
    "ratios": ("rho_mean", "abs_log_rho_mean", "rho_clipped_frac", "c_clipped_frac", "rho_beyond_frac",
               "rho_clipped_mass"),
    "policy": ("kl_learner_actor", "action_agreement", "policy_lag_versions", "search_agreement", "search_tv"),
}
_TAG = {key: f"{group}/{key}" for group, keys in TENSORBOARD_GROUPS.items() for key in keys}


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a row key: ``charts/return_mean``, ``losses/loss``, ``time/learner`` (for
    ``time_learner_s``, seconds), ``ratios/...``, ``policy/...``; already grouped keys (``refresh/kl``) as
    they are; others ``train/<key>``."""
    if "/" in key:
        return key
    if key.startswith("time_") and key.endswith("_s"):
        return f"time/{key[5:-2]}"
    return _TAG.get(key, f"train/{key}")


class TensorBoardSink:
    """An events file in ``logdir``.

    ``purge_step``: a resumed run's first env step after its checkpoint: TensorBoard hides the events of
    earlier sessions in ``logdir`` at this step and later (tensorboardX ``SummaryWriter(purge_step=...)``,
    a ``SessionLog.START`` event), so the steps logged again after a resume appear once. None: no purge.
    """

    def __init__(self, logdir: str, purge_step: int | None = None):
        from tensorboardX import SummaryWriter

        # The events file is named after the second it was opened in; the nanoseconds after it keep a session
        # resumed within the same second from overwriting the earlier one's file, and sort after it.
        self._writer = SummaryWriter(logdir, purge_step=purge_step, filename_suffix=f".{time.time_ns()}")

    def write(self, row: dict, step: int) -> None:
        """A logged row's scalars (all but ``update``) at env step ``step``."""
        self.add_scalars({k: v for k, v in row.items() if k != "update"}, step)

    def add_scalars(self, values: dict, step: int) -> None:
        """The finite ``values`` (row key or tag -> scalar) as one event at ``step``. The same records as one
        ``add_scalar`` per tag (one ``Summary.Value`` each), but one ``Summary`` proto for all of them: far
        less host time, which the Anakin loop's chunks otherwise share the CPU with."""
        from tensorboardX.proto.summary_pb2 import Summary

        tags = [Summary.Value(tag=tensorboard_tag(k), simple_value=float(v)) for k, v in values.items() if np.isfinite(v)]
        self._writer._get_file_writer().add_summary(Summary(value=tags), step)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._writer.add_scalar(tag, value, step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        self._writer.add_text(tag, text, step)

    def close(self) -> None:
        self._writer.close()
