"""Watch a trained policy: one episode as an animated GIF (or MP4), drawn from the env's observations with
matplotlib (``matplotlib.animation``: ``PillowWriter`` for GIF, ``FFMpegWriter`` for MP4).

* image observations: MinAtar's ``[H, W, C]`` channels as colours (each cell takes the colour of its
  highest set channel, black where none is, as gymnax's MinAtar visualiser); Atari's channels-first
  frame stack ``[4, 84, 84]`` shows its newest frame in grey;
* CartPole (``[x, ẋ, θ, θ̇]``): the cart and pole drawn at ``x`` and ``θ``;
* other vector observations: a bar chart of the observation.
"""
from __future__ import annotations

import os

import numpy as np

from accerl_jax.config import ConfigError

FORMATS = (".gif", ".mp4")
FPS = 30
CELL = 16  # pixels per MinAtar grid cell


def check_video_path(path: str) -> None:
    """Refuse a ``--video`` path that cannot be written.

    Raises:
      ConfigError: a suffix other than .gif/.mp4, .mp4 without ffmpeg, a folder that does not exist or
        cannot be written, or a path that is a folder.
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise ConfigError(f"bad --video {path!r}; expected a path ending in {' or '.join(FORMATS)}")
    if suffix == ".mp4":
        from matplotlib import animation

        if not animation.writers.is_available("ffmpeg"):
            raise ConfigError(f"bad --video {path!r}: MP4 needs ffmpeg, which is not installed; write a .gif instead")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"bad --video {path!r}: it is a folder; expected a file name ending in .gif or .mp4")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ConfigError(f"bad --video {path!r}: its folder {folder!r} does not exist or cannot be written")
    # access() answers for permissions only (as root, /proc passes): create and remove the file the video is
    # first written to, so that a path that cannot be written is refused now, not after the episode is played.
    probe = _tmp_path(path)
    try:
        with open(probe, "x"):
            pass
        os.remove(probe)
    except FileExistsError:  # left by an earlier run that was stopped: the folder takes files
        pass
    except OSError as err:
        raise ConfigError(f"bad --video {path!r}: cannot write there ({err.strerror or err})") from None


def _tmp_path(path: str) -> str:
    """Where a video is written before it is renamed to ``path`` (same suffix, so the writer picks its format)."""
    return f"{path}.tmp{os.path.splitext(path)[1]}"


def record_episode(trained, *, greedy: bool = False, seed: int = 1) -> np.ndarray:
    """The observations of one whole episode of ``trained`` (:class:`accerl_jax.trained.Trained`) on one
    fresh env of its env id: ``[L + 1, *obs_shape]``, from the first observation to the final one."""
    import jax

    from accerl_jax.envs import make_env
    from accerl_jax.trained import make_forward

    env = make_env(trained.cfg.env, 1, seed)
    forward = jax.jit(make_forward(trained.apply, trained.params, env.info))
    step = jax.jit(env.step) if env.info.jittable else env.step
    env_state, obs = (jax.jit(env.reset) if env.info.jittable else env.reset)(jax.random.PRNGKey(seed))
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 2)
    frames = [np.asarray(obs[0])]
    for _ in range(env.info.max_episode_steps + 1):
        key, sub = jax.random.split(key)
        action, best, _ = forward(obs, sub)
        env_state, tr = step(env_state, np.asarray(best if greedy else action))
        if not bool(np.asarray(tr.valid)[0]):
            continue
        frames.append(np.asarray(tr.next_obs[0]))
        if bool(np.asarray(tr.terminated)[0] or np.asarray(tr.truncated)[0]):
            break
        obs = tr.obs
    return np.stack(frames)


def grid_image(obs: np.ndarray, channels_first: bool) -> np.ndarray:
    """An RGB ``uint8`` image of one image observation (module docstring): ``[H * CELL, W * CELL, 3]`` for
    MinAtar's ``[H, W, C]``, ``[84, 84, 3]`` for a channels-first frame stack."""
    if channels_first:
        frame = np.asarray(obs[-1], np.float32)
        frame = (255 * frame / max(float(frame.max()), 1.0)) if frame.max() > 255 else frame
        return np.repeat(frame.astype(np.uint8)[..., None], 3, axis=-1)
    from matplotlib import colormaps

    channels = obs.shape[-1]
    palette = (np.asarray(colormaps["tab10" if channels <= 10 else "tab20"].colors)[:channels, :3] * 255).astype(np.uint8)
    on = np.asarray(obs) > 0
    top = np.where(on.any(-1), channels - 1 - np.argmax(on[..., ::-1], axis=-1), -1)  # highest set channel
    image = np.where((top >= 0)[..., None], palette[np.maximum(top, 0)], 0).astype(np.uint8)
    return np.kron(image, np.ones((CELL, CELL, 1), np.uint8))


def write_video(frames: np.ndarray, info, path: str, fps: int = FPS) -> None:
    """Write ``frames`` (:func:`record_episode`'s observations) as an animated GIF or MP4 at ``fps``.

    Raises:
      ConfigError: see :func:`check_video_path`.
    """
    check_video_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import animation

    fig, update = _figure(frames, info)
    anim = animation.FuncAnimation(fig, update, frames=len(frames), interval=1000 / fps, blit=False)
    writer = animation.PillowWriter(fps=fps) if path.lower().endswith(".gif") else animation.FFMpegWriter(fps=fps)
    tmp = _tmp_path(path)
    try:
        anim.save(tmp, writer=writer)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)


def _figure(frames: np.ndarray, info):
    """A matplotlib figure and its ``update(i)`` that draws frame ``i``."""
    import matplotlib.pyplot as plt

    title = info.name.partition(":")[2]
    if frames.ndim == 4:
        first = grid_image(frames[0], info.channels_first)
        fig, ax = plt.subplots(figsize=(first.shape[1] / 80, first.shape[0] / 80 + 0.3), dpi=80)
        im = ax.imshow(first, interpolation="nearest")
        ax.set_axis_off()
        text = ax.set_title(title, fontsize=9)

        def update(i):
            im.set_data(grid_image(frames[i], info.channels_first))
            text.set_text(f"{title}  step {i}")

        return fig, update
    if "CartPole" in info.name and frames.shape[-1] == 4:
        fig, ax = plt.subplots(figsize=(4.8, 2.4), dpi=80)
        ax.set_xlim(-2.6, 2.6)
        ax.set_ylim(-0.4, 1.4)
        ax.set_aspect("equal")
        ax.set_yticks([])
        ax.axhline(0, color="0.5", lw=1)
        cart = plt.Rectangle((0, 0), 0.5, 0.3, color="tab:blue")
        ax.add_patch(cart)
        (pole,) = ax.plot([], [], lw=4, color="tab:orange", solid_capstyle="round")
        text = ax.set_title(title, fontsize=9)

        def update(i):
            x, theta = float(frames[i][0]), float(frames[i][2])
            cart.set_xy((x - 0.25, 0.0))
            top = (x + np.sin(theta), 0.3 + np.cos(theta))  # pole length 1 (twice gymnax's half-length)
            pole.set_data([x, top[0]], [0.3, top[1]])
            text.set_text(f"{title}  step {i}  x={x:+.2f}  θ={np.degrees(theta):+.1f}°")

        return fig, update
    flat = frames.reshape(len(frames), -1)
    fig, ax = plt.subplots(figsize=(4.8, 2.4), dpi=80)
    bars = ax.bar(np.arange(flat.shape[1]), flat[0])
    bound = float(np.abs(flat).max()) or 1.0
    ax.set_ylim(-bound, bound)
    text = ax.set_title(title, fontsize=9)

    def update(i):
        for bar, h in zip(bars, flat[i]):
            bar.set_height(float(h))
        text.set_text(f"{title}  step {i} (observation)")

    return fig, update
