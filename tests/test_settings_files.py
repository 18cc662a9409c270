"""Settings files (--config) are read as their users wrote them: numbers as YAML 1.2 and TOML read them,
string settings as the text written, and the literals YAML 1.1 reads otherwise (leading zeros, base 60,
yes/no/on/off) refused with one line naming the setting, the literal and what to write. Parsing only."""
from __future__ import annotations

import pytest

from accerl_jax import train
from accerl_jax.config import ConfigError

# (file content, suffix, {field: expected value}); each is read otherwise by YAML 1.1 (PyYAML's safe_load),
# except where the comment says it guards what already worked.
ACCEPTED = [
    ("compile_cache: off\n", ".yaml", {"compile_cache": "off"}),  # 1.1: False, refused as not a string
    ("compile_cache: Off\n", ".yaml", {"compile_cache": "Off"}),  # a folder named Off, as --compile-cache Off
    ("wandb_project: on\n", ".yaml", {"wandb_project": "on"}),
    ("wandb_project: off\n", ".yaml", {"wandb_project": "off"}),
    ("wandb_project: yes\n", ".yaml", {"wandb_project": "yes"}),
    ("wandb_project: no\n", ".yaml", {"wandb_project": "no"}),
    ("wandb_project: 0123\n", ".yaml", {"wandb_project": "0123"}),  # 1.1: octal 83, refused as not a string
    ("env: gymnax:CartPole-v1\ncompressor: none\n", ".yaml", {"env": "gymnax:CartPole-v1", "compressor": "none"}),
    ("seed: 0o10\n", ".yaml", {"seed": 8}),  # YAML 1.2's octal (1.1: the text '0o10')
    ("seed: 0x10\n", ".yaml", {"seed": 16}),
    ("total_steps: 1e3\n", ".yaml", {"total_steps": 1000}),  # guards what already worked (1.1: text, then read)
    ("hidden_sizes: [1e2, 64]\n", ".yaml", {"hidden_sizes": (100, 64)}),  # as --hidden-sizes 1e2 64
    ("total_steps = 1e3\n", ".toml", {"total_steps": 1000}),  # TOML's float 1000.0, whole: as --total-steps 1e3
    ("reward_clip: false\nanneal_lr: True\n", ".yaml", {"reward_clip": False, "anneal_lr": True}),
    ("logdir: ~\nwandb_project: null\n", ".yaml", {"logdir": None, "wandb_project": None}),
]


@pytest.mark.parametrize("content, suffix, expected", ACCEPTED, ids=[c[0].strip() for c in ACCEPTED])
def test_settings_file_values_mean_what_they_say(tmp_path, content, suffix, expected):
    path = tmp_path / f"cfg{suffix}"
    path.write_text(content)
    cfg = train.parse_config(["--config", str(path)])
    got = {name: getattr(cfg, name) for name in expected}
    assert got == expected and all(type(got[k]) is type(v) for k, v in expected.items()), got


# (file content, [parts of the one-line error]): YAML 1.1 reads the first three silently as other numbers.
REFUSED = [
    ("seed: 010\n", ["seed: 010 is ambiguous", "octal 8 in YAML 1.1", "write 10, or 0o10 for octal"]),
    ("hidden-sizes: [064, 64]\n", ["hidden_sizes: 064 is ambiguous", "octal 52 in YAML 1.1", "write 64"]),
    ("total_steps: 1:30\n", ["total_steps: 1:30 is ambiguous", "base 60 in YAML 1.1: 90", "write 90"]),
    ("reward_clip: on\n", ["reward_clip: on is not a boolean in YAML 1.2", "YAML 1.1 reads it as true",
                           "write true or false"]),
    ("reward_clip: off\n", ["reward_clip: off is not a boolean", "as false"]),
    ("anneal_lr: yes\n", ["anneal_lr: yes is not a boolean", "as true"]),
    ("anneal_lr: no\n", ["anneal_lr: no is not a boolean", "as false"]),
    ("seed: ~\n", ["seed = ~ (null); expected an integer"]),  # 1.1 and 1.2 both null: named as written
]


@pytest.mark.parametrize("content, parts", REFUSED, ids=[c[0].strip() for c in REFUSED])
def test_ambiguous_settings_file_literals_are_refused_naming_them(tmp_path, capsys, content, parts):
    path = tmp_path / "cfg.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        train.parse_config(["--config", str(path)])
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"bad --config {str(path)!r}: "), message
    for part in parts:
        assert part in message, (part, message)
    assert train.main(["--config", str(path), "--logdir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "run").exists()


def test_toml_and_yaml_go_through_the_same_field_checks(tmp_path):
    toml = tmp_path / "cfg.toml"
    toml.write_text("compile_cache = false\n")
    with pytest.raises(ConfigError, match="compile_cache = False; expected a string"):
        train.parse_config(["--config", str(toml)])
    toml.write_text("total_steps = 1.5e3\nseed = 1\n")
    assert train.parse_config(["--config", str(toml)]).total_steps == 1500
    toml.write_text("total_steps = 2.5\n")
    with pytest.raises(ConfigError, match="total_steps = 2.5; expected an integer"):
        train.parse_config(["--config", str(toml)])
