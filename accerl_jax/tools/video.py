"""Watch a trained policy: one episode as an animated GIF (or MP4), drawn from the env's observations.

Each frame is drawn as an RGB array with numpy and Pillow (``ImageDraw``), without a plotting library,
and written by Pillow (GIF: one shared palette, no per-frame colour search) or piped to ffmpeg (MP4):

* image observations: MinAtar's ``[H, W, C]`` channels as colours (each cell takes the colour of its
  highest set channel, black where none is, as gymnax's MinAtar visualiser); Atari's channels-first
  frame stack ``[4, 84, 84]`` shows its newest frame in grey;
* CartPole (``[x, ẋ, θ, θ̇]``): the cart and pole drawn at ``x`` and ``θ``;
* other vector observations: a bar chart of the observation.

A title band above each frame names the env and the step.
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
        if _ffmpeg() is None:
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


def _ffmpeg():
    """The ffmpeg executable (matplotlib's ``animation.ffmpeg_path`` setting, else ``ffmpeg`` on PATH), or None."""
    import shutil

    import matplotlib

    return shutil.which(matplotlib.rcParams["animation.ffmpeg_path"]) or shutil.which("ffmpeg")


def _tmp_path(path: str) -> str:
    """Where a video is written before it is renamed to ``path`` (same suffix, so the writer picks its format)."""
    return f"{path}.tmp{os.path.splitext(path)[1]}"


class _Bar:
    """A rich progress bar of ``total`` ``unit``."""

    def __init__(self, label: str, unit: str, total: int):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(),
                                 TextColumn(f"{{task.completed:>5,}}/{{task.total:,}} {unit}"), TimeElapsedColumn())
        self.task = self.progress.add_task(label, total=total)
        self.progress.start()

    def update(self, completed: int, total: int | None = None) -> None:
        self.progress.update(self.task, completed=completed, **({} if total is None else {"total": total}))

    def stop(self) -> None:
        self.progress.stop()


def grid_image(obs: np.ndarray, channels_first: bool) -> np.ndarray:
    """An RGB ``uint8`` image of one image observation (module docstring): ``[H * CELL, W * CELL, 3]`` for
    MinAtar's ``[H, W, C]``, ``[84, 84, 3]`` for a channels-first frame stack."""
    if channels_first:
        frame = np.asarray(obs[-1], np.float32)
        frame = (255 * frame / max(float(frame.max()), 1.0)) if frame.max() > 255 else frame
        return np.repeat(frame.astype(np.uint8)[..., None], 3, axis=-1)
    channels = obs.shape[-1]
    palette = _palette(channels)
    on = np.asarray(obs) > 0
    top = np.where(on.any(-1), channels - 1 - np.argmax(on[..., ::-1], axis=-1), -1)  # highest set channel
    image = np.where((top >= 0)[..., None], palette[np.maximum(top, 0)], 0).astype(np.uint8)
    return np.repeat(np.repeat(image, CELL, axis=0), CELL, axis=1)


# matplotlib's "tab10" and "tab20" qualitative colours (the MinAtar channels' colours), as uint8 RGB.
_TAB10 = ("1f77b4", "ff7f0e", "2ca02c", "d62728", "9467bd", "8c564b", "e377c2", "7f7f7f", "bcbd22", "17becf")
_TAB20 = ("1f77b4", "aec7e8", "ff7f0e", "ffbb78", "2ca02c", "98df8a", "d62728", "ff9896", "9467bd", "c5b0d5",
          "8c564b", "c49c94", "e377c2", "f7b6d2", "7f7f7f", "c7c7c7", "bcbd22", "dbdb8d", "17becf", "9edae5")


def _palette(channels: int) -> np.ndarray:
    """``[channels, 3]`` uint8 colours of MinAtar's channels (tab10, or tab20 beyond 10; repeated beyond 20)."""
    names = _TAB10 if channels <= 10 else _TAB20
    rgb = np.asarray([[int(h[i:i + 2], 16) for i in (0, 2, 4)] for h in names], np.uint8)
    return rgb[np.arange(channels) % len(rgb)]


BAND = 18  # pixels of the title band above each frame
WIDTH, HEIGHT = 384, 192  # the drawing of a vector observation (CartPole, bars), title band excluded
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (128, 128, 128)
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)  # tab:blue, tab:orange


def frame_drawer(frames: np.ndarray, info):
    """``draw(i)``: observation ``i`` of one episode's ``frames [L + 1, *obs_shape]`` drawn as an RGB image
    (module docstring), ``[H, W, 3]`` uint8, every frame of one size (``H`` and ``W`` even, as ffmpeg's
    yuv420p needs). ``info`` is the env's :class:`accerl_jax.envs.base.EnvInfo`."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=12)
    title = info.name.partition(":")[2]
    cartpole = "CartPole" in info.name and frames.ndim == 2 and frames.shape[-1] == 4
    flat = frames.reshape(len(frames), -1).astype(np.float32)
    bound = float(np.abs(flat).max()) or 1.0

    def draw_frame(i: int) -> np.ndarray:
        if frames.ndim == 4:
            picture = grid_image(frames[i], info.channels_first)
            h, w = picture.shape[:2]
            canvas = Image.new("RGB", (w + w % 2, h + h % 2 + BAND), WHITE)
            canvas.paste(Image.fromarray(picture), (0, BAND))
            caption = f"{title}  step {i}"
        else:
            canvas = Image.new("RGB", (WIDTH, HEIGHT + BAND), WHITE)
            draw = ImageDraw.Draw(canvas)
            if cartpole:
                caption = _draw_cartpole(draw, float(frames[i][0]), float(frames[i][2]), title, i)
            else:
                _draw_bars(draw, flat[i], bound)
                caption = f"{title}  step {i} (observation)"
        ImageDraw.Draw(canvas).text((4, 3), caption, fill=BLACK, font=font)
        return np.asarray(canvas)

    return draw_frame


def _draw_cartpole(draw, x: float, theta: float, title: str, i: int) -> str:
    """The cart at ``x`` and the pole at angle ``theta`` (radians) on the track ``[-2.6, 2.6]``; returns the caption."""
    scale = WIDTH / 5.2  # pixels per unit of x
    ground = BAND + HEIGHT - 0.4 * scale  # y = 0 (the track), with room below as the old axes had

    def at(u: float, v: float) -> tuple[float, float]:
        return (u + 2.6) * scale, ground - v * scale

    draw.line([at(-2.6, 0.0), at(2.6, 0.0)], fill=GREY, width=1)
    draw.rectangle([at(x - 0.25, 0.3), at(x + 0.25, 0.0)], fill=BLUE)
    # pole length 1 (twice gymnax's half-length)
    draw.line([at(x, 0.3), at(x + np.sin(theta), 0.3 + np.cos(theta))], fill=ORANGE, width=5)
    return f"{title}  step {i}  x={x:+.2f}  theta={np.degrees(theta):+.1f} deg"


def _draw_bars(draw, values: np.ndarray, bound: float) -> None:
    """A bar per observation entry, heights scaled so that ``bound`` reaches the drawing's edge."""
    n = len(values)
    mid = BAND + HEIGHT / 2
    slot = (WIDTH - 16) / n
    draw.line([(8, mid), (WIDTH - 8, mid)], fill=GREY, width=1)
    for k, v in enumerate(values):
        left = 8 + k * slot + 0.1 * slot
        top = mid - float(v) / bound * (HEIGHT / 2 - 4)
        draw.rectangle([left, min(mid, top), left + 0.8 * slot, max(mid, top)], fill=BLUE)


def write_video(frames: np.ndarray, info, path: str, fps: int = FPS, progress: bool = False) -> None:
    """Write ``frames`` (one episode's observations ``[L + 1, *obs_shape]``, as
    :func:`accerl_jax.evaluate.play` records them) as an animated GIF or MP4 at ``fps``; the
    file appears whole (written beside ``path``, then renamed). ``progress``: a bar of the frames drawn.

    Raises:
      ConfigError: see :func:`check_video_path`.
    """
    check_video_path(path)
    tmp = _tmp_path(path)
    draw = frame_drawer(frames, info)
    bar = _Bar("video", "frames", len(frames)) if progress else None
    tick = (lambda done: bar.update(done)) if bar is not None else (lambda done: None)
    try:
        if path.lower().endswith(".gif"):
            _write_gif(draw, len(frames), tmp, fps, tick)
        else:
            _write_mp4(draw, len(frames), tmp, fps, tick, path)
        os.replace(tmp, path)
    finally:
        if bar is not None:
            bar.stop()
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_gif(draw, n: int, path: str, fps: int, tick) -> None:
    """An animated GIF of the ``n`` frames ``draw(i)``, all in one palette: the adaptive palette of 16 evenly
    spaced frames (quantizing to a fixed palette is a lookup per pixel; an adaptive palette per frame would
    search the colours of every frame). ``tick(i)`` after frame ``i`` is drawn."""
    from PIL import Image

    pick = [Image.fromarray(draw(i)) for i in range(0, n, max(1, n // 16))]
    strip = Image.new("RGB", (pick[0].width, pick[0].height * len(pick)))
    for k, image in enumerate(pick):
        strip.paste(image, (0, k * pick[0].height))
    palette = strip.quantize(colors=255, method=Image.Quantize.MEDIANCUT)
    paletted = []
    for i in range(n):
        paletted.append(Image.fromarray(draw(i)).quantize(palette=palette, dither=Image.Dither.NONE))
        tick(i + 1)
    paletted[0].save(path, save_all=True, append_images=paletted[1:], duration=round(1000 / fps), loop=0,
                     optimize=False, disposal=1)


def _write_mp4(draw, n: int, path: str, fps: int, tick, shown: str) -> None:
    """An H.264 MP4 of the ``n`` frames ``draw(i)`` (even sizes), piped to ffmpeg as raw RGB frames."""
    import subprocess

    ffmpeg = _ffmpeg()
    first = draw(0)
    h, w = first.shape[:2]
    cmd = [ffmpeg, "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", str(fps),
           "-i", "-", "-an", "-vcodec", "libx264", "-pix_fmt", "yuv420p", path]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            for i in range(n):
                proc.stdin.write(np.ascontiguousarray(first if i == 0 else draw(i)).tobytes())
                tick(i + 1)
        except BrokenPipeError:  # ffmpeg stopped early: its exit status and message tell why
            pass
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
        err = proc.stderr.read().decode(errors="replace")
    if proc.returncode:
        raise ConfigError(f"bad --video {shown!r}: ffmpeg failed ({err.strip().splitlines()[-1] if err.strip() else proc.returncode})")
