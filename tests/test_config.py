"""The config loader: defaults < file < environment, loud failures, secrets only from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import ConfigError, load_config


def test_defaults() -> None:
    cfg = load_config(env={})
    assert cfg.trainer.train_every == 100_000
    assert cfg.joiner.attribution_window_s == 900.0
    assert cfg.features.windows_s == (3_600, 86_400)


def test_file_then_environment(tmp_path: Path) -> None:
    f = tmp_path / "ctr.toml"
    f.write_text("[trainer]\ntrain_every = 5000\nhidden = [32, 16]\n[joiner]\nattribution_window_s = 60\n")
    cfg = load_config(f, env={"CTR_TRAINER_TRAIN_EVERY": "7_000", "CTR_FEATURES_WINDOWS_S": "60,600"})
    assert cfg.trainer.train_every == 7_000
    assert cfg.trainer.hidden == (32, 16)
    assert cfg.joiner.attribution_window_s == 60.0
    assert cfg.features.windows_s == (60, 600)


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("[trainer]\ntrain_every = 'many'\n", {}, "trainer.train_every"),
        ("[trainer]\nnope = 1\n", {}, "Unknown config field 'trainer.nope'"),
        ("[nope]\nx = 1\n", {}, "Unknown config section"),
        ("", {"CTR_TRAINER_BATCH_SIZE": "1.5"}, "trainer.batch_size"),
        ("[validation]\npseudonym_key = 'k'\n", {}, "is a secret"),
    ],
)
def test_bad_values_fail_loudly(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    f = tmp_path / "ctr.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(f, env=env)


def test_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml", env={})


def test_secret_comes_from_environment_and_is_not_exported() -> None:
    cfg = load_config(env={"CTR_VALIDATION_PSEUDONYM_KEY": "s3cret"})
    assert cfg.validation.pseudonym_key == "s3cret"
    assert "s3cret" not in str(cfg.to_dict()) and "s3cret" not in repr(cfg)
