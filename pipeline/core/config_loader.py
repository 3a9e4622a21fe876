"""Loading :class:`~pipeline.core.config.Config`: defaults < TOML file < ``CTR_<SECTION>_<FIELD>`` variables.

Every value is cast and checked by the section's pydantic dataclass; all bad values are reported
at once, one line each, naming the field and where the value came from. An unknown ``CTR_``
variable or TOML key is an error with the closest field suggested; secrets are refused in files.

>>> cfg = load_config(env={"CTR_TRAINER_TRAIN_EVERY": "5000"})
>>> cfg.trainer.train_every
5000
>>> load_config(env={"CTR_KAFKA_PARTITIONS": "0"})
Traceback (most recent call last):
...
pipeline.core.config_types.ConfigError: kafka.partitions must be >= 1, got 0 (from CTR_KAFKA_PARTITIONS)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from pipeline.core.config import Config
from pipeline.core.config_types import URL_PASSWORD, ConfigError, masked

__all__ = ["OTHER_ENV", "env_names", "load_config"]

# CTR_ names that are not config fields but are read by something else here; any other CTR_ name
# is an error (a typo, or a name nothing reads any more, must not fall back to a default silently)
OTHER_ENV = frozenset(
    {
        # deploy/services.sh: where the local services live and listen
        *("CTR_CACHE", "CTR_STATE", "CTR_VENV", "CTR_SERVICES_TIMEOUT"),
        *("CTR_KAFKA_VERSION", "CTR_KAFKA_PORT", "CTR_KAFKA_CONTROLLER_PORT", "CTR_KAFKA_HEAP"),
        *("CTR_KAFKA_LOG_LEVEL", "CTR_REDIS_PORT", "CTR_REDIS_PERSIST"),
        *("CTR_MLFLOW_PORT", "CTR_MLFLOW_WORKERS", "CTR_MLFLOW_JOBS"),
        *("CTR_KAFKA_CLI_HEAP", "CTR_KAFKA_CLI_LOG_LEVEL"),  # deploy/kafka-cli.sh
        *("CTR_PYTHON", "CTR_VENV_ROOT"),  # deploy/venv.sh
        *("CTR_TOOLS_BIN", "CTR_VEGETA"),  # deploy/vegeta.sh, benchmarks/load_tools.py
        "CTR_BIND_HOST",  # deploy/systemd/ctr-serve@.service (from ctr.env)
        *("CTR_FEAST_PROJECT", "CTR_FEAST_REDIS", "CTR_FEAST_KEY_TTL"),  # features/repo/*.yaml placeholders
        *("CTR_SERVICES_EXTERNAL", "CTR_TEST_REDIS_DB"),  # tests/integration/conftest.py
    }
)

_SECTIONS: dict[str, type[Any]] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(Config)
}
_DEFAULTS: dict[str, dict[str, Any]] = {
    name: {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)} for name, cls in _SECTIONS.items()
}


def _env_name(section: str, name: str) -> str:
    return f"CTR_{section.upper()}_{name.upper()}"


def env_names() -> dict[str, tuple[str, str]]:
    """Every ``CTR_<SECTION>_<FIELD>`` name the loader reads -> ``(section, field)``.

    >>> env_names()["CTR_KAFKA_PARTITIONS"]
    ('kafka', 'partitions')
    """
    return {_env_name(sec, name): (sec, name) for sec, fields in _DEFAULTS.items() for name in fields}


def _is_secret(section: str, name: str) -> bool:
    return isinstance(_DEFAULTS[section][name], SecretStr)


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _shown(section: str, name: str, raw: Any) -> str:
    return "'**********'" if _is_secret(section, name) else repr(masked(raw))


_NOT_A = {
    "int_parsing": "not an integer",
    "int_type": "not an integer",
    "int_from_float": "not an integer",
    "float_parsing": "not a number",
    "float_type": "not a number",
    "bool_parsing": "not a boolean (true/false, 1/0, yes/no, on/off)",
    "bool_type": "not a boolean (true/false, 1/0, yes/no, on/off)",
    "string_type": "not a string",
    "tuple_type": "not a list",
}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _describe(section: str, exc: ValidationError, raws: dict[str, Any], origins: dict[str, str]) -> list[str]:
    """One line per error: the field, the value, the rule, and the variable or file it came from."""
    lines = []
    for err in exc.errors():
        name = str(err["loc"][0]) if err["loc"] else "?"
        item = "".join(f"[{i}]" for i in err["loc"][1:])
        where, raw = origins.get(name, "default"), raws.get(name, _DEFAULTS[section].get(name))
        label, ctx = f"{section}.{name}{item}", err.get("ctx") or {}
        if err["type"] in _NOT_A:
            if where.startswith("CTR_"):
                lines.append(
                    f"Config '{where}' = {_shown(section, name, raw)}: {_NOT_A[err['type']]} ({label})"
                )
            else:
                lines.append(
                    f"Config '{label}' = {_shown(section, name, raw)} (from {where}): {_NOT_A[err['type']]}"
                )
            continue
        if err["type"] in _BOUNDS:
            rule = f"must be {_BOUNDS[err['type']]} {next(iter(ctx.values()))}"
        elif err["type"] == "literal_error":
            rule = f"must be one of {ctx.get('expected', '?').replace(' or ', ', ')}"
        else:
            rule = f"is invalid: {err['msg']}"
        plain = err["type"] in _BOUNDS and isinstance(raw, str) and not item  # a number, as typed
        got = raw if plain else _shown(section, name, raw)
        lines.append(f"{label} {rule}, got {got} (from {where})")
    return lines


def _read_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Config file {p} does not exist; pass an existing TOML file or none.")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"Config file {p} is not valid TOML: {exc}") from exc


def _from_file(values: dict[str, Any], where: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The file's values by section, and one error per unknown section, unknown key or secret."""
    out: dict[str, dict[str, Any]] = {}
    errors = []
    for section, table in values.items():
        if section not in _SECTIONS:
            errors.append(
                f"Unknown config section [{section}] in {where}{_suggest(section, list(_SECTIONS))}"
            )
            continue
        if not isinstance(table, dict):
            errors.append(f"Config [{section}] in {where} must be a table of fields, got {table!r}")
            continue
        out[section] = {}
        for key, raw in table.items():
            known = list(_DEFAULTS[section])
            if key not in _DEFAULTS[section]:
                errors.append(f"Unknown config field '{section}.{key}' in {where}{_suggest(key, known)}")
            elif _is_secret(section, key):
                errors.append(
                    f"Config '{section}.{key}' is a secret: set {_env_name(section, key)} "
                    f"in the environment file, not in the config file ({where})."
                )
            elif isinstance(raw, str) and URL_PASSWORD.search(raw):
                errors.append(
                    f"Config '{section}.{key}' carries a password, a secret: set {_env_name(section, key)} "
                    f"in the environment file, not in the config file ({where})."
                )
            else:
                out[section][key] = raw
    return out, errors


def _from_env(env: Mapping[str, str]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The ``CTR_<SECTION>_<FIELD>`` values by section, and one error per unknown ``CTR_`` name."""
    names = env_names()
    out: dict[str, dict[str, str]] = {}
    errors = []
    for key, raw in env.items():
        if key in names:
            section, name = names[key]
            out.setdefault(section, {})[name] = raw
        elif key.startswith("CTR_") and key not in OTHER_ENV:
            errors.append(f"Unknown config variable {key}{_suggest(key, list(names))}")
    return out, errors


def _cast(section: str, name: str, raw: Any) -> Any:
    """What pydantic cannot read from text by itself: a comma-separated list, and 1_000 in TOML."""
    if isinstance(_DEFAULTS[section][name], tuple) and isinstance(raw, str):
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    if isinstance(raw, bool) and not isinstance(_DEFAULTS[section][name], bool):
        return str(raw).lower()  # pydantic would take true for 1: make it fail as "not an integer"
    return raw


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Build a :class:`Config` from defaults, an optional TOML file and ``CTR_*`` variables.

    Every error is collected first: one :class:`ConfigError` lists them all, a line each.
    """
    env = os.environ if env is None else env
    where = str(path)
    file_values, errors = _from_file(_read_file(path), where) if path is not None else ({}, [])
    env_values, env_errors = _from_env(env)
    errors += env_errors
    sections: dict[str, Any] = {}
    for section, cls in _SECTIONS.items():
        raws: dict[str, Any] = {**file_values.get(section, {}), **env_values.get(section, {})}
        origins = {n: where for n in file_values.get(section, {})}
        origins |= {n: _env_name(section, n) for n in env_values.get(section, {})}
        try:
            sections[section] = cls(**{n: _cast(section, n, raw) for n, raw in raws.items()})
        except ValidationError as exc:
            errors += _describe(section, exc, raws, origins)
    trainer, features = sections.get("trainer"), sections.get("features")
    if (
        trainer is not None
        and features is not None
        and trainer.model == "din"
        and not features.sequence_length
    ):
        errors.append(
            "trainer.model = 'din' attends over the users' behaviour sequences, which are off: set "
            "features.sequence_length (e.g. 50; CTR_FEATURES_SEQUENCE_LENGTH) or choose another model"
        )
    joiner = sections.get("joiner")
    if (
        trainer is not None
        and joiner is not None
        and trainer.model == "esmm"
        and not joiner.conversion_window_s
    ):
        errors.append(
            "trainer.model = 'esmm' learns conversions, which are not joined: set "
            "joiner.conversion_window_s (e.g. 86400; CTR_JOINER_CONVERSION_WINDOW_S) or choose another model"
        )
    if errors:
        head = "" if len(errors) == 1 else f"{len(errors)} config errors:\n  "
        raise ConfigError(head + "\n  ".join(errors))
    return Config(**sections)
