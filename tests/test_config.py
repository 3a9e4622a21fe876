"""The config loader: defaults < file < environment; choices, ranges and names checked at load, each
error naming the field and where the value came from; secrets only from the environment, never shown."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from pipeline.core.config import (
    Config,
    ConfigError,
    DaemonConfig,
    FeaturePath,
    InferencePath,
    KafkaConfig,
    ModelName,
    SaslMechanism,
    SecurityProtocol,
    ServingConfig,
    ValidationConfig,
)
from pipeline.core.config_loader import OTHER_ENV, env_names, load_config

REPO = Path(__file__).resolve().parents[1]


def _toml(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "ctr.toml"
    f.write_text(text)
    return f


def test_defaults() -> None:
    cfg = load_config(env={})
    assert cfg.trainer.train_every == 100_000
    assert cfg.joiner.attribution_window_s == 900.0
    assert cfg.features.windows_s == (3_600, 86_400)
    assert cfg == Config()


def test_every_default_passes_its_own_rules() -> None:
    """Each section rebuilt from its defaults, given explicitly, validates (types, choices, ranges)."""
    cfg = Config()
    for sec in dataclasses.fields(cfg):
        section = getattr(cfg, sec.name)
        again = type(section)(**{f.name: getattr(section, f.name) for f in dataclasses.fields(section)})
        assert again == section


def test_file_then_environment(tmp_path: Path) -> None:
    f = _toml(
        tmp_path, "[trainer]\ntrain_every = 5000\nhidden = [32, 16]\n[joiner]\nattribution_window_s = 60\n"
    )
    cfg = load_config(f, env={"CTR_TRAINER_TRAIN_EVERY": "7_000", "CTR_FEATURES_WINDOWS_S": "60,600"})
    assert cfg.trainer.train_every == 7_000
    assert cfg.trainer.hidden == (32, 16)
    assert cfg.joiner.attribution_window_s == 60.0
    assert cfg.features.windows_s == (60, 600)


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (
            "[trainer]\ntrain_every = 'many'\n",
            {},
            r"Config 'trainer.train_every' = 'many' \(from .*ctr.toml\)",
        ),
        ("[trainer]\ntrain_every = true\n", {}, "'trainer.train_every' = True .*not an integer"),
        (
            "",
            {"CTR_TRAINER_BATCH_SIZE": "1.5"},
            r"'CTR_TRAINER_BATCH_SIZE' = '1.5': not an integer \(trainer",
        ),
        ("", {"CTR_KAFKA_CHECK_CRCS": "maybe"}, "'CTR_KAFKA_CHECK_CRCS' = 'maybe': not a boolean"),
        ("", {"CTR_JOINER_WATERMARK_LAG_S": "soon"}, "not a number"),
        ("[trainer]\nnope = 1\n", {}, "Unknown config field 'trainer.nope'"),
        ("[trainer]\ntrain_evry = 1\n", {}, "'trainer.train_evry' in .*; did you mean train_every"),
        ("[nope]\nx = 1\n", {}, r"Unknown config section \[nope\]"),
        ("[trainr]\nseed = 1\n", {}, r"\[trainr\] .*did you mean trainer\?"),
        ("trainer = 3\n", {}, r"\[trainer\] .* must be a table"),
        ("[trainer\n", {}, "is not valid TOML"),
        ("[validation]\npseudonym_key = 'k'\n", {}, "is a secret"),
    ],
)
def test_bad_values_fail_loudly(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_toml(tmp_path, text), env=env)


def test_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml", env={})


# -- choices ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "CTR_TRAINER_MODEL",
            "xgb",
            "trainer.model must be one of 'deepfm', 'dcnv2', 'lr', 'din', 'esmm', got 'xgb'",
        ),
        ("CTR_TRAINER_DEVICE", "tpu", "trainer.device must be one of 'auto', 'cpu', 'cuda', got 'tpu'"),
        ("CTR_DAEMON_LOG_FORMAT", "xml", "daemon.log_format must be one of 'text', 'json'"),
        ("CTR_SERVING_FEATURE_PATH", "x", "serving.feature_path must be one of 'redis', 'feast'"),
        ("CTR_KAFKA_SECURITY_PROTOCOL", "TLS", "kafka.security_protocol must be one of 'PLAINTEXT'"),
        ("CTR_KAFKA_SASL_MECHANISM", "GSSAPI", "kafka.sasl_mechanism must be one of '', 'PLAIN'"),
        ("CTR_KAFKA_COMPRESSION_TYPE", "brotli", "kafka.compression_type must be one of '', 'gzip'"),
    ],
)
def test_a_value_outside_the_choices_is_refused_naming_the_field(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message) + f".*\\(from {name}\\)"):
        load_config(env={name: value})


def test_a_choice_from_the_file_names_the_file(tmp_path: Path) -> None:
    f = _toml(tmp_path, "[trainer]\nmodel = 'xgb'\n")
    with pytest.raises(ConfigError, match=f"trainer.model must be one of .* got 'xgb' \\(from {f}\\)"):
        load_config(f, env={})


def test_kafka_names_are_case_insensitive_as_before() -> None:
    cfg = load_config(env={"CTR_KAFKA_SECURITY_PROTOCOL": "sasl_ssl", "CTR_KAFKA_SASL_MECHANISM": "plain"})
    assert (cfg.kafka.security_protocol, cfg.kafka.sasl_mechanism) == ("SASL_SSL", "PLAIN")


def test_the_choices_are_those_of_the_code_that_acts_on_them() -> None:
    from pipeline.kafka import client as kafka_client
    from serving_bridge.process import FEATURE_PATHS
    from trainers.inference import INFERENCE_PATHS
    from trainers.models import MODELS

    assert set(typing.get_args(ModelName)) == set(MODELS)
    assert typing.get_args(FeaturePath) == FEATURE_PATHS
    assert typing.get_args(InferencePath) == INFERENCE_PATHS
    assert typing.get_args(SecurityProtocol) == kafka_client._PROTOCOLS
    assert typing.get_args(SaslMechanism) == ("", *kafka_client._SASL)


# -- ranges -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CTR_KAFKA_PARTITIONS", "0", "kafka.partitions must be >= 1, got 0"),
        ("CTR_TRAINER_TRAIN_EVERY", "-5", "trainer.train_every must be >= 1, got -5"),
        ("CTR_SERVING_REPLICAS", "0", "serving.replicas must be >= 1, got 0"),
        ("CTR_SERVING_CHALLENGER_SHARE", "1.5", "serving.challenger_share must be <= 1"),
        ("CTR_DAEMON_CHECKPOINT_MAX_SHARE", "-0.1", "daemon.checkpoint_max_share must be >= 0"),
        ("CTR_DAEMON_DEAD_LETTER_WARN_SHARE", "2", "daemon.dead_letter_warn_share must be <= 1"),
        ("CTR_JOINER_WATERMARK_LAG_S", "-1", "joiner.watermark_lag_s must be >= 0"),
        ("CTR_DAEMON_JOINER_METRICS_PORT", "70000", "daemon.joiner_metrics_port must be <= 65535"),
        ("CTR_TRAINER_HOLDOUT_FRACTION", "1", "trainer.holdout_fraction must be < 1"),
        ("CTR_FEATURES_WINDOWS_S", "60,0", "features.windows_s[1] must be >= 1, got '60,0'"),
    ],
)
def test_a_value_out_of_range_is_refused_at_load(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{message}") + f".*\\(from {name}\\)"):
        load_config(env={name: value})


def test_the_edge_values_the_readme_and_tests_use_still_load() -> None:
    cfg = load_config(
        env={
            "CTR_DAEMON_JOINER_METRICS_PORT": "0",  # off
            "CTR_TRAINER_THREADS": "0",  # auto
            "CTR_TRAINER_GATE_TOLERANCE": "-0.5",  # no candidate passes (the rollback tests)
            "CTR_TRAINER_MIN_CHAMPION_AUC": "0",  # check off
            "CTR_JOINER_WATERMARK_LAG_S": "0",
            "CTR_SIMULATOR_SHIFT_EVERY_S": "0",  # no shifts
            "CTR_SERVING_CHALLENGER_SHARE": "1",
        }
    )
    assert cfg.trainer.gate_tolerance == -0.5 and cfg.daemon.joiner_metrics_port == 0


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    f = _toml(tmp_path, "[kafka]\npartitions = 0\n")
    with pytest.raises(ConfigError) as err:
        load_config(f, env={"CTR_TRAINER_MODEL": "xgb", "CTR_TRAINER_SEEED": "1"})
    lines = str(err.value).splitlines()
    assert lines[0] == "3 config errors:" and len(lines) == 4, lines


def test_a_section_built_in_code_is_checked_too() -> None:
    with pytest.raises(ValidationError, match="partitions"):
        dataclasses.replace(KafkaConfig(), partitions=0)
    assert dataclasses.replace(KafkaConfig(), partitions=6).partitions == 6


# -- names --------------------------------------------------------------------------------------
def test_an_unknown_ctr_variable_is_an_error_with_the_closest_name() -> None:
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "Unknown config variable CTR_KAFKA_BOOTSTRAP; did you mean CTR_KAFKA_BOOTSTRAP_SERVERS?"
        ),
    ):
        load_config(env={"CTR_KAFKA_BOOTSTRAP": "127.0.0.1:9092"})
    with pytest.raises(ConfigError, match="CTR_TRAINR_TRAIN_EVERY; did you mean CTR_TRAINER_TRAIN_EVERY"):
        load_config(env={"CTR_TRAINR_TRAIN_EVERY": "5"})


def test_variables_of_other_tools_and_other_prefixes_are_left_alone() -> None:
    load_config(env={**dict.fromkeys(OTHER_ENV, "1"), "PATH": "/bin", "MLFLOW_CTR_X": "1"})


def test_every_ctr_name_the_scripts_use_is_a_field_or_listed() -> None:
    """deploy/*, the Feast repo and the integration fixtures: a name neither read by the config nor
    listed in OTHER_ENV would stop every daemon started from that environment."""
    files = [
        p
        for p in (REPO / "deploy").rglob("*")
        if p.is_file() and "kafka/" not in str(p.relative_to(REPO / "deploy"))
    ]
    files += [*(REPO / "features" / "repo").glob("*.yaml"), REPO / "tests" / "integration" / "conftest.py"]
    used = {
        n for p in files for n in re.findall(r"\bCTR_[A-Z0-9_]*[A-Z0-9]\b", p.read_text(errors="replace"))
    }
    assert used, files
    assert used - set(env_names()) - OTHER_ENV == set()


# -- secrets ------------------------------------------------------------------------------------
SECRETS = [
    ("validation", "pseudonym_key", "CTR_VALIDATION_PSEUDONYM_KEY"),
    ("serving", "auth_token", "CTR_SERVING_AUTH_TOKEN"),
    ("kafka", "sasl_password", "CTR_KAFKA_SASL_PASSWORD"),
]


@pytest.mark.parametrize(("section", "name", "env_name"), SECRETS)
def test_a_secret_comes_from_the_environment_and_never_shows(section: str, name: str, env_name: str) -> None:
    cfg = load_config(env={env_name: "s3cret-value"})
    value = getattr(getattr(cfg, section), name)
    assert isinstance(value, SecretStr) and value.get_secret_value() == "s3cret-value"
    assert "s3cret-value" not in repr(cfg) and "s3cret-value" not in str(cfg)
    assert name not in cfg.to_dict()[section] and "s3cret-value" not in json.dumps(cfg.to_dict())


@pytest.mark.parametrize(("section", "name", "env_name"), SECRETS)
def test_a_secret_in_the_file_is_refused(tmp_path: Path, section: str, name: str, env_name: str) -> None:
    with pytest.raises(ConfigError, match=f"'{section}.{name}' is a secret: set {env_name}"):
        load_config(_toml(tmp_path, f"[{section}]\n{name} = 'k'\n"), env={})


def test_a_secret_built_in_code_is_a_secret_too() -> None:
    assert ValidationConfig(pseudonym_key="k").pseudonym_key.get_secret_value() == "k"  # type: ignore[arg-type]
    assert "k0" not in repr(ServingConfig(auth_token="k0"))  # type: ignore[arg-type]


def test_a_password_in_a_url_is_masked_and_stays_out_of_the_file(tmp_path: Path) -> None:
    cfg = load_config(env={"CTR_DAEMON_REDIS_URL": "redis://:pw0rd@10.0.0.1:6379/0"})
    assert cfg.daemon.redis_url == "redis://:pw0rd@10.0.0.1:6379/0"  # what the clients connect with
    assert cfg.to_dict()["daemon"]["redis_url"] == "redis://:***@10.0.0.1:6379/0"
    assert "pw0rd" not in repr(cfg) and "pw0rd" not in repr(DaemonConfig(redis_url="redis://u:pw0rd@h/0"))
    f = _toml(tmp_path, "[daemon]\nredis_url = 'redis://:pw0rd@h:6379/0'\n")
    with pytest.raises(ConfigError, match=r"'daemon\.redis_url' carries a password.*CTR_DAEMON_REDIS_URL"):
        load_config(f, env={})


def test_ctr_config_prints_no_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.ops.cli import main

    monkeypatch.setenv("CTR_KAFKA_SASL_PASSWORD", "s3cret-value")
    monkeypatch.setenv("CTR_DAEMON_REDIS_URL", "redis://:pw0rd@h:6379/0")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["kafka"]["partitions"] == 3
    assert "s3cret-value" not in out and "pw0rd" not in out


def test_ctr_exits_2_naming_the_bad_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.ops.cli import main

    monkeypatch.setenv("CTR_KAFKA_PARTITIONS", "abc")
    assert main(["config"]) == 2
    assert (
        "Config 'CTR_KAFKA_PARTITIONS' = 'abc': not an integer (kafka.partitions)" in capsys.readouterr().err
    )


def test_din_without_behaviour_sequences_is_refused_with_what_to_set() -> None:
    with pytest.raises(ConfigError, match=r"features\.sequence_length"):
        load_config(env={"CTR_TRAINER_MODEL": "din"})
    cfg = load_config(env={"CTR_TRAINER_MODEL": "din", "CTR_FEATURES_SEQUENCE_LENGTH": "30"})
    assert (cfg.trainer.model, cfg.features.sequence_length) == ("din", 30)
