"""Every fenced code block of README.md runs, so the README cannot drift from the code.

How a block is run, by its language:

- ``bash``/``sh``: the block is one bash script (``set -euo pipefail``), run in one temporary folder shared
  by all blocks, in README order: a block may use what an earlier one wrote (``runs/long`` trained in
  "Resume" is evaluated and exported in "Evaluate, watch, export"). Blocks under the headings of
  :data:`SIDE_LANE` use only their own outputs and run in a second lane, beside the others. ``python`` is this interpreter and
  ``accerl-train`` the installed script (or ``python -m accerl_jax.train`` where it is not installed).
  Every training command (``python -m accerl_jax.train ...``, ``accerl-train ...``) gets :data:`BUDGET`
  appended; flags given later on a command line override earlier ones, so a line's own
  ``--total-steps 2000000`` or ``--num-envs 32`` becomes the tiny budget and every other flag stays as
  written. ``accerl_jax.evaluate`` lines get :data:`EVAL_BUDGET` the same way.
- ``python``: run by this interpreter (``python -``) in the same folder; ``total_steps=<n>`` in a
  ``Config(...)`` becomes the tiny budget (:data:`PY_BUDGET`). A python or yaml block whose first line is
  ``# file: NAME`` is a file the reader saves: it is written to NAME instead (``my_env.py``,
  ``my_run.yaml``).
- Anything else (``text``: the picture, the layout) is not a command and is skipped.

The few lines that cannot run as written here are in :data:`EXCEPTIONS`, each with what runs instead and
why. docs/GUIDE.md's bash blocks are parsed (every training flag must exist and parse), not run.

Time (2-core CPU machine, persistent compilation cache of conftest.py, every command under ``nice -n 19``
while a benchmark kept the machine busy): 304 s wall in two lanes at load average ~7 (258 s CPU), 395 s in
one lane at load ~3-4 (230 s CPU). About 15 processes train, evaluate or export, and each costs ~13-15 s
CPU even when every program comes from the cache (imports, tracing, the run's own start-up measurements),
so two idle cores need about 2 minutes: more than the ~100 s aimed at.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
GUIDE = os.path.join(REPO, "docs", "GUIDE.md")

BUDGET = "--total-steps 64 --num-envs 4 --rollout-length 8 --log-every 1 --no-progress"
EVAL_BUDGET = "--episodes 4 --num-envs 4 --no-progress"
PY_BUDGET = "total_steps=64, num_envs=4, rollout_length=8, log_every=1, progress=False"
TRAIN = re.compile(r"^(\S+=\S+\s+)*(python -m accerl_jax\.train|accerl-train)\b")
PARSE_ONLY = "import sys; from accerl_jax import train; train.parse_config(sys.argv[1:])"
RESUME = re.compile(r"--resume (\S+)")

# README headings whose blocks use only what they write themselves: they run in a second lane, beside the
# other blocks (two processes at a time on two cores), which about halves this file's wall time.
SIDE_LANE = ("Train on another environment", "Several seeds", "Sweeps in one program", "GPU, several devices, a cluster",
             "Your own compressor")

# A README line that contains the key is run as described by its value (or not run), for the reason given.
EXCEPTIONS = {
    "pip install -r requirements.txt -e .":
        "install blocks: .ci/run does the install and runs the test command (checked by "
        "test_install_blocks_are_what_ci_runs); here only the main job, python -m accerl_jax.train, runs",
    'pip install "jax[cuda12]':
        "not run: installs JAX's CUDA build (a package install, for an NVIDIA GPU)",
    "tensorboard --logdir":
        "a server that never exits: run as tensorboard --inspect --logdir runs (reads every events file, "
        "prints what it holds, exits); skipped where tensorboard is not installed",
    "--coordinator-address host0:1234":
        "checked by parsing only (host0:1234, N and i read as 127.0.0.1:<free port>, 2 and 0): two processes "
        "would double this file's time, and tests/test_devices.py (test_two_processes_cli_train_the_main_job_"
        "to_the_end) already runs this command as two processes on 127.0.0.1; with --resume, parsed without "
        "--resume and its folder (never trained here), which tests/test_multihost_resume.py resumes as 2 processes",
    "--resume":
        "each resume continues a tiny run that has already finished, so the test gives it one tiny budget "
        "more (--total-steps 64 x (k + 1) for the k-th resume of that run) instead of BUDGET",
}


def blocks(path: str) -> list[tuple[int, str, str]]:
    """(line of the opening fence, language, code) of every fenced block in ``path``."""
    out, lang, start, code = [], None, 0, []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if lang is None and line.startswith("```"):
                lang, start, code = line[3:].strip() or "text", i, []
            elif lang is not None and line.rstrip() == "```":
                out.append((start, lang, "".join(code)))
                lang = None
            elif lang is not None:
                code.append(line)
    assert lang is None, f"{path}: unclosed code block at line {start}"
    return out


def commands(code: str, first_line: int) -> list[tuple[int, str]]:
    """(README line, command without its trailing comment) of a shell block; continuation lines joined."""
    out, pending, at = [], "", 0
    for i, line in enumerate(code.splitlines()):
        if not pending:
            at = first_line + 1 + i
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        line = re.sub(r"(^|\s+)#\s.*$", "", line).strip()
        if line:
            out.append((at, " ".join(line.split())))
    return out


def exception_for(command: str) -> str | None:
    return next((key for key in EXCEPTIONS if key in command), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shell_script(code: str, first_line: int, resumes: dict) -> str:
    """The bash script that runs a README shell block here (see the module docstring)."""
    lines = ["set -euo pipefail"]
    for at, cmd in commands(code, first_line):
        key = exception_for(cmd)
        run = cmd
        if key == "pip install -r requirements.txt -e .":
            if "accerl_jax.train" not in cmd:
                continue  # the test command: .ci/run runs it
            run = "python -m accerl_jax.train " + BUDGET
        elif key == 'pip install "jax[cuda12]':
            continue
        elif key == "tensorboard --logdir":
            if shutil.which("tensorboard") is None:
                lines.append(f"echo 'README.md:{at}: skipped, tensorboard is not installed here'")
                continue
            run = cmd.replace("tensorboard --logdir", "tensorboard --inspect --logdir")
        elif key == "--resume":
            folder = RESUME.search(cmd).group(1)
            resumes[folder] = resumes.get(folder, 0) + 1
            run = f"{cmd} --total-steps {64 * (resumes[folder] + 1)} --log-every 1 --no-progress"
        elif key == "--coordinator-address host0:1234":
            args = (cmd.split("accerl_jax.train", 1)[1].replace("host0:1234", f"127.0.0.1:{free_port()}")
                    .replace("--num-processes N", "--num-processes 2").replace("--process-id i", "--process-id 0"))
            args = RESUME.sub("", args)
            run = f"python -c {shlex.quote(PARSE_ONLY)} {args}"
        elif TRAIN.match(cmd):
            run = f"{cmd} {BUDGET}"
        elif "accerl_jax.evaluate" in cmd:
            run = f"{cmd} {EVAL_BUDGET}"
        lines += [f"echo {shlex.quote(f'+ README.md:{at}: {run}')}", run]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The folder every block runs in, and a bin/ first on PATH with ``python`` and ``accerl-train``."""
    work = tmp_path_factory.mktemp("readme")
    shims = tmp_path_factory.mktemp("bin")
    (shims / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a symlink would lose the venv
    (shims / "python").chmod(0o755)
    script = os.path.join(os.path.dirname(sys.executable), "accerl-train")
    if os.path.exists(script):
        os.symlink(script, shims / "accerl-train")
    else:
        (shims / "accerl-train").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m accerl_jax.train "$@"\n')
        (shims / "accerl-train").chmod(0o755)
    env = dict(os.environ, PATH=f"{shims}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return {"path": work, "env": env, "resumes": {}}


README_BLOCKS = blocks(README)


def run_block(start: int, lang: str, code: str, folder: dict):
    """Run one README block (see the module docstring): a CompletedProcess, or None where nothing runs."""
    work, env = folder["path"], folder["env"]
    if lang in ("bash", "sh"):
        return subprocess.run(["bash", "-c", shell_script(code, start, folder["resumes"])], cwd=work, env=env,
                              capture_output=True, text=True, timeout=1200)
    if lang == "python" and not code.startswith("# file: "):
        code = re.sub(r"total_steps=[\d_]+", PY_BUDGET, code)
        return subprocess.run([sys.executable, "-"], input=code, cwd=work, env=env, capture_output=True, text=True,
                              timeout=1200)
    return None


def headings(path: str) -> dict[int, str]:
    """The heading each line of ``path`` is under (``#`` lines inside code blocks are not headings)."""
    out, current, fenced = {}, "", False
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                current = line.lstrip("#").strip()
            out[i] = current
    return out


@pytest.fixture(scope="module")
def lanes(folder):
    """Every README block started in README order in two lanes, two processes at a time: blocks under
    :data:`SIDE_LANE` headings in one, all others in the other; within a lane one after another. Files the
    reader saves (``# file: NAME`` blocks) are written first. Returns {block line: Future of its result}."""
    under = headings(README)
    for start, lang, code in README_BLOCKS:
        if code.startswith("# file: ") and lang in ("python", "yaml", "toml"):
            (folder["path"] / code.splitlines()[0][len("# file: "):].strip()).write_text(code)
    futures = {start: concurrent.futures.Future() for start, _, _ in README_BLOCKS}

    def lane(todo):
        for start, lang, code in todo:
            try:
                futures[start].set_result(run_block(start, lang, code, folder))
            except Exception as err:  # e.g. a timeout: reported by that block's test
                futures[start].set_exception(err)

    side = [b for b in README_BLOCKS if under[b[0]] in SIDE_LANE]
    main = [b for b in README_BLOCKS if under[b[0]] not in SIDE_LANE]
    pool = concurrent.futures.ThreadPoolExecutor(2)
    pool.submit(lane, main)
    pool.submit(lane, side)
    yield futures
    pool.shutdown(wait=True)


def test_side_lane_headings_exist():
    assert set(SIDE_LANE) <= set(headings(README).values())


@pytest.mark.parametrize("start,lang,code", README_BLOCKS, ids=[f"README.md:{b[0]}-{b[1]}" for b in README_BLOCKS])
def test_readme_block_runs(start, lang, code, lanes):
    """One README block, run as the module docstring says (in one shared folder, in README order within
    its lane)."""
    proc = lanes[start].result(timeout=1800)
    if proc is None:
        pytest.skip(f"```{lang} block: not a command, or a file the reader saves")
    assert proc.returncode == 0, f"README.md block at line {start} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"


def test_install_blocks_are_what_ci_runs():
    """The two install blocks are .ci/run's: it installs with ``-r requirements.txt -e .`` and its last line
    is the README's test command, byte for byte; the quick-start line ends with the main job."""
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read().strip().splitlines()
    shell = [code.strip() for _, lang, code in README_BLOCKS if lang == "bash"]
    installs = [c for c in shell if c.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install "
                                                 "-r requirements.txt -e . && ")]
    assert len(installs) == 2, installs
    main_job, tests = installs
    assert main_job.endswith("&& python -m accerl_jax.train")
    assert tests.split(" && ")[-1] == ci[-1]
    assert any("pip install" in line and "-r requirements.txt -e ." in line for line in ci)


def test_every_exception_is_used():
    """Each entry of EXCEPTIONS matches a README line (a stale exception would hide nothing, but mislead)."""
    text = open(README, encoding="utf-8").read()
    for key in EXCEPTIONS:
        assert key in text, f"EXCEPTIONS[{key!r}] matches no README line"


def test_readme_links_exist():
    """Every relative link of the README (notebooks, docs) points to a file or folder that exists."""
    text = open(README, encoding="utf-8").read()
    for target, anchor in re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", text):
        path = os.path.join(REPO, target) if target else README
        assert os.path.exists(path), target
        if anchor and path.endswith(".md"):
            assert anchor in anchors(path), f"{target}#{anchor}: no such heading"


def anchors(path: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings (and its explicit <a id=...>)."""
    text = open(path, encoding="utf-8").read()
    out = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.*)$", text, re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return out


def test_readme_holds_no_measurements():
    """Measurements live in docs/RESULTS.md; the README holds none (numbers of a machine go stale)."""
    text = open(README, encoding="utf-8").read()
    for word in ("steps/s", "load average", "issue", "target return of", "measured", "faster than"):
        assert word not in text.lower(), word
    assert not re.search(r"\d+(\.\d+)? ?(s|ms|seconds|minutes)\b", text), "a time in the README"
    assert not re.search(r"\d\.\d+x\b", text), "a ratio in the README"


def guide_commands() -> list[tuple[int, str]]:
    if not os.path.exists(GUIDE):
        return []
    out = []
    for start, lang, code in blocks(GUIDE):
        if lang in ("bash", "sh"):
            out += [(at, cmd) for at, cmd in commands(code, start) if TRAIN.match(cmd)]
    return out


@pytest.mark.parametrize("at,cmd", guide_commands(), ids=[f"GUIDE.md:{c[0]}" for c in guide_commands()])
def test_guide_training_commands_parse(at, cmd):
    """docs/GUIDE.md's training commands use flags that exist, with values that parse and pass the checks
    made before anything is built (not run: the README's commands run)."""
    from accerl_jax import train
    from accerl_jax.run import plan

    argv = shlex.split(cmd)
    argv = argv[argv.index("accerl_jax.train") + 1:] if "accerl_jax.train" in argv else argv[1:]
    argv = [a.replace("host0:1234", "127.0.0.1:1234").replace("N", "2") if a in ("host0:1234", "N") else a
            for a in argv]
    argv = ["0" if a == "i" else a for a in argv]
    if {"--help", "--help-all"} & set(argv):
        return  # docs/CLI.md is this text (tests/test_cli_reference.py)
    resumed = "--resume" in argv
    for flag in ("--config", "--resume"):  # files and folders that exist only on the reader's machine
        if flag in argv:
            del argv[argv.index(flag):argv.index(flag) + 2]
    cfg = train.parse_config(argv)
    if not resumed and cfg.num_processes is None:
        plan.check_config(cfg)
