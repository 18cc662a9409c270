"""What ``python -m accerl_jax.train --help`` shows (flag names, metavars, defaults) and how unknown flags and
settings-file keys are answered: parsing only, nothing trains."""
from __future__ import annotations

import dataclasses
import re

import pytest

from accerl_jax import train
from accerl_jax.tools import cli, presets
from accerl_jax.config import COMMON_NAMES, Config, flag
from test_cli import run_cli

# Other frameworks' names for our fields that a new user tries first (CleanRL, Stable-Baselines3, RLlib).
FOREIGN = [("lr", "learning_rate"), ("gamma", "discount"), ("gae_lambda", "lambda_"), ("ent_coef", "entropy_coef"),
           ("vf_coef", "value_coef"), ("num_steps", "rollout_length"), ("n_steps", "rollout_length"),
           ("clip_coef", "ppo_clip"), ("clip_range", "ppo_clip"), ("update_epochs", "epochs"), ("n_epochs", "epochs"),
           ("num_minibatches", "minibatches"), ("total_timesteps", "total_steps")]


@pytest.fixture(scope="module")
def help_text():
    proc = run_cli("--help-all", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_short_help_names_every_flag_once_and_explains_the_common_ones_in_80_columns(capsys):
    """``--help`` is what most runs need: the common group's flags, one line of help each with the default
    (a preset's where one is given), the other groups' flag names, and where the full reference is."""
    for argv, env in ((["--help"], "gymnax:CartPole-v1"), (["--preset", "mujoco", "-h"], "envpool:HalfCheetah-v4")):
        with pytest.raises(SystemExit) as stop:
            train.parse_config(argv)
        assert stop.value.code == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert len(lines) <= 45 and max(map(len, lines)) <= 80
        named = re.findall(r"(?<![\w-])--[a-z0-9]+(?:-[a-z0-9]+)*", out)
        every = {flag(f.name) for f in dataclasses.fields(Config)}
        assert every <= set(named) and {n for n in named if n != "--help-all"} <= every
        entries, current = {}, None  # the common flags' entries: "  --flag   text", continued 21 columns in
        for ln in lines[lines.index(next(ln for ln in lines if ln.startswith("  --preset"))):]:
            if ln.startswith("  --"):
                current, text = ln.split(None, 1)
                entries[current] = text
            elif ln.startswith(" " * 21) and current:
                entries[current] += " " + ln.strip()
            else:
                break
        assert list(entries) == [flag(f) for f in cli.GROUPS[0][2]]
        for f in cli.GROUPS[0][2]:
            assert entries[flag(f)].startswith(cli.SHORT_HELP[f] + " [") and entries[flag(f)].endswith("]"), f
        assert entries["--env"].endswith(f"[{env}]")
        assert all(name in entries["--preset"] for name in presets.PRESETS), entries["--preset"]  # none forgotten
        assert "--help-all" in lines[-1] or "--help-all" in lines[-2]


def entry(help_text: str, name: str) -> str:
    """The help of one flag, as one line: from its own line to the next flag's (box borders removed)."""
    raw = help_text.splitlines()
    lines = [line.strip("│ ") for line in raw]
    start = next(i for i, line in enumerate(lines) if raw[i].startswith("│ --") and (line.startswith(name + " ")
                                                                                      or line == name))
    end = next((i for i in range(start + 1, len(lines)) if raw[i].startswith(("│ --", "╰"))), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


def test_lambda_is_shown_as_lambda_and_both_spellings_work(help_text, tmp_path):
    assert re.search(r"^│ --lambda FLOAT ", help_text, flags=re.M), entry(help_text, "--lambda")
    assert "--lambda_" not in help_text  # the old spelling is accepted, not listed
    for argv in (["--lambda", "0.9"], ["--lambda_", "0.9"], ["--lambda=0.9"], ["--lambda_=0.9"]):
        assert train.parse_config(argv).lambda_ == 0.9, argv
    for key in ("lambda", "lambda_"):
        path = tmp_path / f"{key}.yaml"
        path.write_text(f"{key}: 0.8\n")
        assert train.parse_config(["--config", str(path)]).lambda_ == 0.8, key


def test_hidden_sizes_help_says_what_its_empty_default_means(help_text):
    from accerl_jax.networks import default_spec

    text = entry(help_text, "--hidden-sizes")
    assert "(default: )" not in help_text and "(default: ()" not in help_text
    widths = {net: " ".join(map(str, default_spec((84, 84, 4), 6, network=net).widths))
              for net in ("mlp", "cnn", "minatar", "impala")}
    assert default_spec((4,), 2).widths == default_spec((84, 84, 4), 6, network="mlp").widths
    assert (f"(default: unset: the --network family's own: {widths['mlp']} (mlp), {widths['cnn']} (cnn), "
            f"{widths['minatar']} (minatar), {widths['impala']} (impala))") in text, text


def test_optional_flags_show_a_clean_metavar_and_what_unset_means(help_text):
    assert "{None}" not in help_text and "None|" not in help_text and "(default: None)" not in help_text
    optional = {f.name for f in dataclasses.fields(Config) if str(f.type).startswith("Optional[")}
    assert optional == set(cli.UNSET), "every optional flag says what leaving it unset does"
    for name, (metavar, unset) in cli.UNSET.items():
        text = entry(help_text, f"{flag(name)} {metavar}")
        assert f"(default: {unset})" in text, text
    # A value given by a settings file or preset is shown as the default instead.
    given = run_cli("--preset", "minatar", "--help-all", timeout=120).stdout
    assert entry(given, "--preset NAME").endswith("(default: minatar)"), entry(given, "--preset NAME")


def test_every_foreign_name_maps_to_a_config_field():
    names = {f.name for f in dataclasses.fields(Config)}
    assert set(COMMON_NAMES.values()) <= names
    assert not set(COMMON_NAMES) & names  # our own names are never "another framework's"
    for foreign, ours in FOREIGN:
        assert COMMON_NAMES[foreign] == ours


@pytest.mark.parametrize("foreign, ours", FOREIGN)
def test_settings_file_with_another_frameworks_name_suggests_ours(tmp_path, capsys, foreign, ours):
    path = tmp_path / "cfg.yaml"
    path.write_text(f"{foreign}: 1\n")
    assert train.main(["--config", str(path), "--logdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown setting {foreign!r} (perhaps {ours}" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("foreign, ours", FOREIGN)
def test_unknown_flag_with_another_frameworks_name_suggests_ours(tmp_path, capsys, foreign, ours):
    wrong = "--" + foreign.replace("_", "-")
    assert train.main([wrong, "1", "--logdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown flag {wrong} (perhaps {flag(ours)}" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--capture-video"], "unknown flag --capture-video; here: after training, python -m accerl_jax.evaluate RUN_DIR --video"),
    (["--capture_video=True"], "unknown flag --capture_video; here: after training, python -m accerl_jax.evaluate"),
    (["--save-model"], "python -m accerl_jax.export RUN_DIR --out DIR"),
    (["--exp-name", "x"], "unknown flag --exp-name; here: --logdir runs/NAME"),
    (["--CLIP_EPS", "0.2"], "unknown flag --CLIP_EPS; here: --ppo-clip"),
])
def test_another_frameworks_flag_without_a_flag_of_ours_says_how_it_is_done_here(tmp_path, capsys, argv, needle):
    assert train.main(argv + ["--logdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "--return-window" not in err, err
    assert err.rstrip().endswith("python -m accerl_jax.train --help-all lists every flag")
    assert not (tmp_path / "run").exists()


def test_other_ways_never_shadow_a_flag_or_a_common_name():
    known = cli.known_flags()
    for name in cli.OTHER_WAYS:
        assert flag(name) not in known and name not in COMMON_NAMES, name


@pytest.mark.parametrize("argv, needle", [
    (["--num-env", "3"], "unknown flag --num-env (perhaps --num-envs"),
    (["--no-anneal", "--seed", "1"], "unknown flag --no-anneal (perhaps --no-anneal-lr"),
    (["--learning_rte=0.1"], "unknown flag --learning_rte (perhaps --learning-rate"),
    (["--seed", "-1", "--xyzzy"], "unknown flag --xyzzy; python -m accerl_jax.train --help-all lists every flag"),
])
def test_misspelled_flag_suggests_the_closest(capsys, argv, needle):
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_unknown_flag_from_the_real_entry_point_is_one_line(tmp_path):
    proc = run_cli("--lr", "1e-3", "--logdir", str(tmp_path / "run"), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == ("error: unknown flag --lr (perhaps --learning-rate); python -m accerl_jax.train --help-all "
                           "lists every flag\n"), proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--seed", "abc"], "bad --seed 'abc'; expected an integer"),
    (["--total-steps", "2.5"], "bad --total-steps '2.5'; expected an integer"),
    (["--hidden-sizes", "64", "x"], "bad --hidden-sizes 'x'; expected an integer"),
    (["--learning-rate=fast"], "bad --learning-rate 'fast'; expected a number"),
])
def test_a_value_that_is_not_a_number_of_the_flags_kind_is_one_line(capsys, argv, needle):
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_integer_flags_take_whole_numbers_in_any_notation():
    cfg = train.parse_config(["--total-steps", "1e6", "--num-envs=3.2e1", "--hidden-sizes", "64", "1.28e2",
                              "--seed", "7.0", "--learning-rate", "2e-4", "--num-processes", "1e0"])
    assert (cfg.total_steps, cfg.num_envs, cfg.hidden_sizes, cfg.seed, cfg.learning_rate, cfg.num_processes) == (
        1_000_000, 32, (64, 128), 7, 2e-4, 1)


def test_known_flags_in_every_spelling_still_parse():
    cfg = train.parse_config(["--num_envs", "8", "--no_anneal_lr", "--total-steps=64", "--learning-rate", "-1e-3",
                              "--hidden-sizes", "32", "16"])
    assert (cfg.num_envs, cfg.anneal_lr, cfg.total_steps, cfg.learning_rate, cfg.hidden_sizes) == (
        8, False, 64, -1e-3, (32, 16))
