"""One typed configuration object, loaded from an optional TOML file plus environment variables.

Precedence: defaults < TOML file < environment. Every field of every section can be set from the
environment as ``CTR_<SECTION>_<FIELD>`` (upper case), e.g. ``CTR_JOINER_ATTRIBUTION_WINDOW_S=600``.
Values are cast to the field's type; a value that does not cast fails loudly and names the field.
Secrets (the pseudonymization key, passwords) come only from the environment, never from the file.

>>> cfg = load_config(env={"CTR_TRAINER_TRAIN_EVERY": "5000"})
>>> cfg.trainer.train_every
5000
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BacktestConfig",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "FeatureConfig",
    "JoinerConfig",
    "JsonlConfig",
    "KafkaConfig",
    "RegistryConfig",
    "ServingConfig",
    "SimulatorConfig",
    "TrainerConfig",
    "ValidationConfig",
    "load_config",
]


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type."""


@dataclass
class ValidationConfig:
    max_event_bytes: int = 65_536  # a raw event larger than this is a dead letter
    max_features: int = 64  # most categorical / dense entries an impression may carry
    max_value_chars: int = 256  # longest categorical feature value
    max_future_skew_s: float = 300.0  # events further ahead of the clock are rejected
    max_past_age_s: float = 7 * 86_400.0  # events older than this behind the clock are rejected
    pii_feature_keys: tuple[str, ...] = ("device_id", "device_ip", "ip")  # hashed like user_id
    # Key of the keyed hash that pseudonymizes user/device ids. Secret: set it in the environment
    # (CTR_VALIDATION_PSEUDONYM_KEY); the default is for demos and tests only.
    pseudonym_key: str = field(default="demo-only-not-secret", repr=False)


@dataclass
class JoinerConfig:
    attribution_window_s: float = 900.0  # a click counts if it comes within this of its impression
    watermark_lag_s: float = 60.0  # watermark = max event time seen - lag (tolerated disorder)
    early_click_hold_s: float = 900.0  # how long a click waits for an impression it came before
    dedup_horizon_s: float = 3_600.0  # ids are remembered this long past their window for dedup


@dataclass
class FeatureConfig:
    windows_s: tuple[int, ...] = (3_600, 86_400)  # sliding windows of the streaming counters
    bucket_s: int = 300  # granularity of the sliding windows
    ctr_prior_clicks: float = 1.0  # smoothed CTR = (clicks + a) / (impressions + a / prior_ctr)
    ctr_prior_rate: float = 0.05  # the prior CTR used for smoothing
    push_every_events: int = 50_000  # micro-batch size of pushes to the Feast store
    max_lateness_s: int = 3_600  # events this far behind their entity's newest still count exactly
    ttl_s: int = 2 * 86_400  # Feast feature view ttl (historical joins; online reads ignore it)
    repo_path: str = ""  # Feast repository; empty = the bundled features/repo with a per-run store
    project: str = "ctr"  # Feast project name (each replay gets its own store folder)


@dataclass
class TrainerConfig:
    model: str = "deepfm"  # deepfm | dcnv2 | lr
    train_every: int = 100_000  # labelled examples per block
    batch_size: int = 512  # examples per optimizer step (512 beats 2,048 on 100k blocks: more steps)
    batch_size_cuda: int = 0  # examples per step on CUDA; 0 = batch_size (raise only with the lrs)
    hash_buckets: int = 1 << 20  # rows of the hashed embedding table
    embedding_dim: int = 16
    hidden: tuple[int, ...] = (128, 64)  # the MLP layers of DeepFM and DCN-V2
    lr_dense: float = 1e-3  # Adam on the dense parameters
    lr_sparse: float = 1e-2  # SparseAdam on the embedding rows
    epochs_per_block: int = 1
    holdout_fraction: float = 0.1  # the newest share of a block held out for the gate
    gate_tolerance: float = 0.01  # candidate logloss may exceed the champion's by this fraction
    # a block on which the champion's progressive AUC falls below this is refused as corrupt (flipped
    # labels): drift lowers AUC toward 0.5, it does not invert it. 0 turns the check off.
    min_champion_auc: float = 0.45
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 7
    # torch CPU threads; 0 = auto: half the cores (at least 1). The trainer shares its host with the
    # consumer thread and, on small machines, the other daemons: torch's default (one per core)
    # oversubscribes the CPU and its spinning OpenMP workers made a block 3-30x slower under load.
    threads: int = 0


@dataclass
class RegistryConfig:
    tracking_uri: str = ""  # empty = sqlite:///<out>/mlflow.db (embedded profile)
    artifact_root: str = ""  # empty = <out>/mlartifacts
    model_name: str = "ctr-model"
    experiment: str = "ctr-online"
    champion_alias: str = "champion"
    optimizer_state: bool = False  # also store Adam moments in each version (3x artifact) for exact resume


@dataclass
class ServingConfig:
    replicas: int = 2  # in-process replicas (embedded profile)
    poll_interval_s: float = (
        1.0  # how often a replica polls its aliases (a Redis notification wakes it sooner)
    )
    max_candidates: int = 1_000  # most items one POST /score may carry (400 beyond)
    max_body_bytes: int = 1_048_576  # larger POST /score bodies get 413
    max_in_flight: int = 32  # /score requests processed at once; one more gets 503 + Retry-After
    retry_after_s: float = 1.0  # the Retry-After of an overload 503
    # Where features come from: "redis" reads Feast's Redis layout directly (one pipelined round
    # trip, ~2x faster than the SDK; tests/integration/test_redis_reader.py pins it to the SDK's
    # answers); "feast" goes through FeatureStore.get_online_features (any online store).
    feature_path: str = "redis"
    feature_timeout_s: float = 0.1  # a Redis read slower than this scores with default features
    feature_retry_s: float = 1.0  # after a failed read, default features this long before retrying
    torch_threads: int = 1  # torch intra-op threads of a replica; 0 = torch's default (one per core)
    challenger_alias: str = "challenger"  # the registry alias of the A/B challenger
    challenger_share: float = 0.0  # share of users (stable hash of the user id) the challenger scores
    # Bearer token required on POST /score; empty = none. Secret: CTR_SERVING_AUTH_TOKEN only.
    auth_token: str = field(default="", repr=False)


@dataclass
class SimulatorConfig:
    users: int = 5_000
    items: int = 1_000
    topics: int = 8  # latent interest topics of the hidden click model
    events_per_s: float = 50.0  # simulated impressions per event-time second
    drift_half_life_s: float = 4 * 3_600.0  # how fast user interests move
    base_ctr: float = 0.06  # rough overall click rate
    start_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    interest_strength: float = 2.0  # logit weight of user interest · item topic (the drifting signal)
    shift_every_s: float = 1_800.0  # period of abrupt interest shifts; 0 = none
    shift_fraction: float = 0.1  # share of users whose interests are redrawn at each shift
    user_zipf: float = 0.8  # exponent of the Zipf-like user activity (0 = uniform)
    item_zipf: float = 0.8  # exponent of the Zipf-like item exposure (0 = uniform)
    click_delay_median_s: float = 60.0  # lognormal click delay: median
    click_delay_sigma: float = 1.55  # lognormal shape; 1.55 puts ~4% of clicks past 15 minutes
    click_delay_max_s: float = 7_200.0  # delays are capped here (nobody logs clicks hours later)
    duplicate_rate: float = 0.002  # share of impressions and of clicks delivered twice
    early_click_rate: float = 0.002  # share of clicks delivered before their impression
    early_click_max_delay_s: float = 30.0  # only clicks this quick are skewed (impression arrives late)


@dataclass
class BacktestConfig:
    # Labelled logs (Avazu, Criteo, OBD) become impressions plus clicks this much later (lognormal):
    click_delay_median_s: float = 30.0  # median impression -> click delay
    click_delay_sigma: float = 1.0  # lognormal shape of that delay
    click_delay_max_s: float = 600.0  # cap; must not exceed joiner.attribution_window_s
    criteo_rows_per_s: float = 76.0  # Criteo has no timestamps: synthetic clock (45.8M rows in 7 days)
    criteo_start_ms: int = 1_767_225_600_000  # event time of Criteo's first row (2026-01-01Z)
    criteo_user_field: str = ""  # a C1..C26 column used as user id; empty = one anonymous user
    criteo_item_field: str = ""  # a C1..C26 column used as item id; empty = one anonymous item
    ftrl_alpha: float = 0.1  # FTRL baseline: per-coordinate learning-rate scale
    ftrl_beta: float = 1.0  # FTRL baseline: learning-rate smoothing
    ftrl_l1: float = 1.0  # FTRL baseline: L1 (sparsity)
    ftrl_l2: float = 1.0  # FTRL baseline: L2
    ftrl_batch_size: int = 32  # FTRL baseline: rows per update (1 = the per-example textbook form)
    bootstrap_resamples: int = 200  # resamples for the AUC confidence intervals (seeded by --seed)
    register: bool = False  # publish every accepted version to the MLflow registry (slow, full lineage)


@dataclass
class JsonlConfig:
    # Read-time renames for JSONL logs in another vocabulary (pipeline/jsonl_mapping.py), as
    # "canonical=raw" pairs: "type=event_type" (the tag), "impression=imp" (a tag value), "user_id=uid".
    map: tuple[str, ...] = ()  # `--map` adds to these
    map_file: str = ""  # a JSON object of the same pairs ({"type": "event_type"}); empty = none


@dataclass
class KafkaConfig:
    bootstrap_servers: str = "127.0.0.1:19092"  # comma-separated host:port list (deploy/services.sh's broker)
    impressions_topic: str = "impressions"  # raw impressions, JSON, keyed by user id
    clicks_topic: str = "clicks"  # raw clicks, JSON, keyed by user id
    examples_topic: str = "examples"  # the joiner's labelled examples
    dead_letter_topic: str = "dead-letters"  # rejected events with a reason
    partitions: int = 3  # partitions of the topics ensure_topics creates (same for all: co-partitioning)
    replication_factor: int = 1  # replicas of the topics ensure_topics creates (3 on a real cluster)
    group_id_prefix: str = "ctr"  # each daemon's consumer group is "<prefix>-<daemon>"
    client_id: str = "ctr-online"  # names this client in broker logs and quotas
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str = ""  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512; empty = no SASL
    sasl_username: str = ""  # SASL user name (with sasl_mechanism)
    # SASL password. Secret: set it in the environment (CTR_KAFKA_SASL_PASSWORD), never in the file.
    sasl_password: str = field(default="", repr=False)
    ssl_cafile: str = ""  # CA bundle that signed the brokers' certificates; empty = the system CAs
    connect_timeout_ms: int = 10_000  # a client that reaches no broker fails after this
    request_timeout_ms: int = 30_000  # one broker request fails after this
    delivery_timeout_ms: int = 120_000  # a produced record not acknowledged within this fails
    linger_ms: int = 5  # the producer waits this long to fill a batch (throughput vs latency)
    producer_batch_bytes: int = 262_144  # producer batch size per partition; bigger = faster in Python
    compression_type: str = ""  # producer compression: gzip | snappy | lz4 | zstd; empty = none
    poll_timeout_ms: int = 500  # longest one poll waits: the idle-batch period and stop() latency
    max_poll_records: int = 5_000  # most records in one consumed batch
    max_poll_interval_ms: int = 600_000  # a consumer that does not poll for this long leaves its group
    # Static group membership (KIP-345): a daemon restarted with the same id gets its partitions back
    # at once, where a new member waits until the broker expires the dead one (45 s). Unique per
    # daemon process within its group (the systemd units use the host name); empty = dynamic member.
    group_instance_id: str = ""
    check_crcs: bool = True  # verify record CRCs when consuming (pure Python, slow, without crc32c)


@dataclass
class DaemonConfig:
    state_dir: str = "~/.cache/ctr-online/state/daemons"  # checkpoints of the joiner and the trainer
    checkpoint_every_s: float = 5.0  # the joiner makes its output durable and commits this often
    # ... or less often when its state is big: checkpoints take at most this share of the joiner's time
    checkpoint_max_share: float = 0.2
    idle_merge_s: float = 2.0  # a partition's stream silent this long stops holding back the other
    dead_letter_warn_share: float = 0.05  # the joiner warns when dead letters pass this share of a minute
    redis_url: str = "redis://127.0.0.1:16379/0"  # Feast online store and swap notifications
    metrics_host: str = "127.0.0.1"  # where the joiner's and the trainer's /metrics listen
    joiner_metrics_port: int = 0  # GET /metrics of `ctr joiner` (Prometheus text); 0 = off
    trainer_metrics_port: int = 0  # GET /metrics of `ctr trainer`; 0 = off (replicas: their own port)
    log_format: str = "text"  # text | json (one JSON object per line, for journald)
    replica_urls: tuple[str, ...] = ()  # the fleet's base URLs, for `ctr status` (comma-separated in env)


@dataclass
class Config:
    """Everything the pipeline reads. Sections map to the parts of the system."""

    validation: ValidationConfig = field(default_factory=ValidationConfig)
    joiner: JoinerConfig = field(default_factory=JoinerConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    simulator: SimulatorConfig = field(default_factory=SimulatorConfig)
    backtest: BacktestConfig = field(default_factory=BacktestConfig)
    jsonl: JsonlConfig = field(default_factory=JsonlConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every value, secrets removed (for lineage and logs)."""
        out = dataclasses.asdict(self)
        out["validation"].pop("pseudonym_key", None)
        out["kafka"].pop("sasl_password", None)
        out["serving"].pop("auth_token", None)
        return out


_SECRETS = {("validation", "pseudonym_key"), ("kafka", "sasl_password"), ("serving", "auth_token")}


def _cast(section: str, name: str, hint: Any, raw: Any) -> Any:
    where = f"Config '{section}.{name}'"
    origin = typing.get_origin(hint)
    try:
        if origin is tuple:
            (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
            parts = raw if isinstance(raw, list | tuple) else [p for p in str(raw).split(",") if p.strip()]
            return tuple(item(p.strip() if isinstance(p, str) else p) for p in parts)
        if origin in (types.UnionType, typing.Union):
            raise ConfigError(f"{where}: union types are not supported")
        if hint is bool:
            if isinstance(raw, bool):
                return raw
            low = str(raw).strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if hint is int and isinstance(raw, float) and not raw.is_integer():
            raise ValueError(raw)
        if hint is int and isinstance(raw, str):
            return int(raw.replace("_", ""))
        return hint(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where} = {raw!r} is not a valid {getattr(hint, '__name__', hint)}") from exc


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Build a :class:`Config` from defaults, an optional TOML file and ``CTR_*`` variables."""
    env = os.environ if env is None else env
    file_values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"Config file {p} does not exist; pass an existing TOML file or none.")
        file_values = tomllib.loads(p.read_text())
    cfg = Config()
    known = {f.name for f in dataclasses.fields(Config)}
    for section in file_values:
        if section not in known:
            raise ConfigError(f"Unknown config section [{section}]; known: {sorted(known)}")
    for sec_field in dataclasses.fields(Config):
        sec_name = sec_field.name
        section_obj = getattr(cfg, sec_name)
        hints = typing.get_type_hints(type(section_obj))
        from_file = file_values.get(sec_name, {})
        names = {f.name for f in dataclasses.fields(section_obj)}
        for key in from_file:
            if key not in names:
                raise ConfigError(f"Unknown config field '{sec_name}.{key}'; known: {sorted(names)}")
            if (sec_name, key) in _SECRETS:
                raise ConfigError(
                    f"Config '{sec_name}.{key}' is a secret: set CTR_{sec_name.upper()}_{key.upper()} "
                    "in the environment file, not in the config file."
                )
        for f in dataclasses.fields(section_obj):
            env_key = f"CTR_{sec_name.upper()}_{f.name.upper()}"
            if env_key in env:
                raw: Any = env[env_key]
            elif f.name in from_file:
                raw = from_file[f.name]
            else:
                continue
            setattr(section_obj, f.name, _cast(sec_name, f.name, hints[f.name], raw))
    return cfg
