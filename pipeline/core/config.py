"""One typed configuration object, loaded from an optional TOML file plus environment variables.

Precedence: defaults < TOML file < environment. Every field of every section can be set from the
environment as ``CTR_<SECTION>_<FIELD>`` (upper case), e.g. ``CTR_JOINER_ATTRIBUTION_WINDOW_S=600``.
The sections are pydantic dataclasses: values are cast and checked against the field's type, its
choices (``Literal``) and its range when the config loads, and every bad value fails at start-up
with one line naming the field and where the value came from (the variable, or the file). An unknown
``CTR_`` variable or TOML key is an error too, with the closest field suggested: a typo never falls
back silently to a default. Secrets (the pseudonymization key, the bearer token, the SASL password)
are ``SecretStr``: they come only from the environment, never from the file, and never print
(``repr``, :meth:`Config.to_dict`, hence ``ctr config``, logs and lineage); a password in a URL
(``daemon.redis_url``, ``registry.tracking_uri``) is masked the same way.

The loader is :mod:`pipeline.core.config_loader` (:func:`~pipeline.core.config_loader.load_config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from pydantic import SecretStr
from pydantic.dataclasses import dataclass

from pipeline.core.config_kafka import KafkaConfig
from pipeline.core.config_trainer import TrainerConfig
from pipeline.core.config_types import (
    CHECKED,
    Compression,
    ConfigError,
    Count,
    Device,
    FeaturePath,
    InferencePath,
    LogFormat,
    ModelName,
    Natural,
    NonNegative,
    OpenShare,
    Port,
    Positive,
    SaslMechanism,
    Seconds,
    Section,
    SecurityProtocol,
    SequenceLength,
    Share,
    masked,
)

__all__ = [
    "BacktestConfig",
    "Compression",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "Device",
    "FeatureConfig",
    "FeaturePath",
    "InferencePath",
    "JoinerConfig",
    "JsonlConfig",
    "KafkaConfig",
    "LogFormat",
    "ModelName",
    "RegistryConfig",
    "SaslMechanism",
    "SecurityProtocol",
    "ServingConfig",
    "SimulatorConfig",
    "TrainerConfig",
    "ValidationConfig",
]


@dataclass(config=CHECKED, repr=False)
class ValidationConfig(Section):
    max_event_bytes: Count = 65_536  # a raw event larger than this is a dead letter
    max_features: Count = 64  # most categorical / dense entries an impression may carry
    max_value_chars: Count = 256  # longest categorical feature value
    max_future_skew_s: Seconds = 300.0  # events further ahead of the clock are rejected
    max_past_age_s: Seconds = 7 * 86_400.0  # events older than this behind the clock are rejected
    pii_feature_keys: tuple[str, ...] = ("device_id", "device_ip", "ip")  # hashed like user_id
    # Key of the keyed hash that pseudonymizes user/device ids. Secret: set it in the environment
    # (CTR_VALIDATION_PSEUDONYM_KEY); the default is for demos and tests only.
    pseudonym_key: SecretStr = SecretStr("demo-only-not-secret")


@dataclass(config=CHECKED, repr=False)
class JoinerConfig(Section):
    attribution_window_s: Seconds = 900.0  # a click counts if it comes within this of its impression
    watermark_lag_s: Seconds = 60.0  # watermark = max event time seen - lag (tolerated disorder)
    early_click_hold_s: Seconds = 900.0  # how long a click waits for an impression it came before
    dedup_horizon_s: Seconds = 3_600.0  # ids are remembered this long past their window for dedup
    # conversions (the conversions topic / "conversion" events) are joined to the clicked impression
    # if they come within this of its click; a clicked impression is then emitted again, as a
    # correction with its final conversion label, when this window closes. 0 = conversions not
    # joined (each one is counted as ignored)
    conversion_window_s: Seconds = 0.0

    @property
    def label_delay_ms(self) -> int:
        """How long after its impression an example's click label is final (and the merge hands it
        over): the attribution window plus the watermark lag."""
        return round((self.attribution_window_s + self.watermark_lag_s) * 1_000)


@dataclass(config=CHECKED, repr=False)
class FeatureConfig(Section):
    windows_s: tuple[Count, ...] = (3_600, 86_400)  # sliding windows of the streaming counters
    bucket_s: Count = 300  # granularity of the sliding windows
    ctr_prior_clicks: Positive = 1.0  # smoothed CTR = (clicks + a) / (impressions + a / prior_ctr)
    ctr_prior_rate: OpenShare = 0.05  # the prior CTR used for smoothing
    push_every_events: Count = 50_000  # micro-batch size of pushes to the Feast store
    max_lateness_s: Natural = 3_600  # events this far behind their entity's newest still count exactly
    ttl_s: Natural = 2 * 86_400  # Feast feature view ttl (historical joins; online reads ignore it)
    # behaviour sequence per user: the last K clicked items and their click times (0 = not kept);
    # attached point-in-time like the counters, pushed to Feast as list features, read by serving
    sequence_length: SequenceLength = 0
    sequence_ttl_s: Count = 7 * 86_400  # a click older than this (at the impression's time) drops out
    # a user (an item, where items are counted) with no event this long behind the watermark is
    # forgotten: its counters and sequence leave the state, its changelog record is deleted. At least
    # the longest window + max_lateness_s and sequence_ttl_s + max_lateness_s (forgetting then changes
    # no feature of an event less than this - max(longest window, sequence_ttl_s) behind; default: 8
    # days, more than validation.max_past_age_s lets in). 0 = never (the state grows with the users)
    forget_idle_s: Natural = 15 * 86_400
    repo_path: str = ""  # Feast repository; empty = the bundled features/repo with a per-run store
    project: str = "ctr"  # Feast project name (each replay gets its own store folder)


@dataclass(config=CHECKED, repr=False)
class RegistryConfig(Section):
    tracking_uri: str = ""  # empty = sqlite:///<out>/mlflow.db (embedded profile)
    artifact_root: str = ""  # empty = <out>/mlartifacts
    model_name: str = "ctr-model"
    experiment: str = "ctr-online"
    champion_alias: str = "champion"
    optimizer_state: bool = False  # also store Adam moments in each version (3x artifact) for exact resume


@dataclass(config=CHECKED, repr=False)
class ServingConfig(Section):
    replicas: Count = 2  # in-process replicas (embedded profile)
    poll_interval_s: Positive = (
        1.0  # how often a replica polls its aliases (a Redis notification wakes it sooner)
    )
    max_candidates: Count = 1_000  # most items one POST /score may carry (400 beyond)
    max_body_bytes: Count = 1_048_576  # larger POST /score bodies get 413
    max_in_flight: Count = 32  # /score requests admitted at once (reading or scoring); one more gets 503
    workers: Count = 1  # serving processes per `ctr serve`, sharing its port (one per core at most)
    # workers > 1: a worker whose event loop has not ticked for this long is killed and replaced
    # (one process: systemd's watchdog does it, WatchdogSec=30 in ctr-serve@.service)
    worker_hang_s: Positive = 30.0
    retry_after_s: Seconds = 1.0  # the Retry-After of an overload 503
    # Where features come from: "redis" reads Feast's Redis layout directly (one pipelined round
    # trip, ~2x faster than the SDK; tests/integration/test_redis_reader.py pins it to the SDK's
    # answers); "feast" goes through FeatureStore.get_online_features (any online store).
    feature_path: FeaturePath = "redis"
    feature_timeout_s: Positive = 0.1  # a Redis read slower than this scores with default features
    # after this many failed reads in a row, default features for feature_retry_s before retrying
    # (a single late read is one request on defaults, not an outage)
    feature_failures_to_back_off: Count = 3
    feature_retry_s: Seconds = 1.0  # then default features this long before the store is asked again
    torch_threads: Natural = 1  # torch intra-op threads of a replica; 0 = torch's default (one per core)
    # How a replica runs each version it loads: "torchscript" traces and freezes it (the forward of
    # 100 rows 23-31% faster than "eager", same probabilities: benchmarks/README.md "Inference
    # paths"); a version that cannot be traced is served eagerly, with a WARNING.
    inference: InferencePath = "torchscript"
    # where the workers of one `ctr serve` keep the versions their helpers prepared (a cache: a
    # version is immutable in the registry); "" = a fresh folder under the temp dir per `ctr serve`,
    # removed when it exits (the systemd unit may write only its private /tmp)
    model_dir: str = ""
    challenger_alias: str = "challenger"  # the registry alias of the A/B challenger
    challenger_share: Share = 0.0  # share of users (stable hash of the user id) the challenger scores
    # Bearer token required on POST /score; empty = none. Secret: CTR_SERVING_AUTH_TOKEN only.
    auth_token: SecretStr = SecretStr("")


@dataclass(config=CHECKED, repr=False)
class SimulatorConfig(Section):
    users: Count = 5_000
    items: Count = 1_000
    topics: Count = 8  # latent interest topics of the hidden click model
    events_per_s: Positive = 50.0  # simulated impressions per event-time second
    drift_half_life_s: Positive = 4 * 3_600.0  # how fast user interests move
    base_ctr: OpenShare = 0.06  # rough overall click rate
    start_ms: Natural = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    interest_strength: NonNegative = 2.0  # logit weight of user interest · item topic (the drifting signal)
    shift_every_s: Seconds = 1_800.0  # period of abrupt interest shifts; 0 = none
    shift_fraction: Share = 0.1  # share of users whose interests are redrawn at each shift
    user_zipf: NonNegative = 0.8  # exponent of the Zipf-like user activity (0 = uniform)
    item_zipf: NonNegative = 0.8  # exponent of the Zipf-like item exposure (0 = uniform)
    click_delay_median_s: Positive = 60.0  # lognormal click delay: median
    click_delay_sigma: NonNegative = 1.55  # lognormal shape; 1.55 puts ~4% of clicks past 15 minutes
    click_delay_max_s: Seconds = 7_200.0  # delays are capped here (nobody logs clicks hours later)
    duplicate_rate: Share = 0.002  # share of impressions and of clicks delivered twice
    early_click_rate: Share = 0.002  # share of clicks delivered before their impression
    early_click_max_delay_s: Seconds = 30.0  # only clicks this quick are skewed (impression arrives late)
    conversion_rate: Share = 0.0  # mean probability that a click converts (purchase); 0 = no conversions
    conversion_delay_median_s: Positive = 1_800.0  # lognormal click -> conversion delay: median
    conversion_delay_sigma: NonNegative = 1.0  # its lognormal shape
    conversion_delay_max_s: Seconds = 86_400.0  # conversion delays are capped here
    conversion_value_median: NonNegative = 30.0  # median order value (lognormal, cents); 0 = no value


@dataclass(config=CHECKED, repr=False)
class BacktestConfig(Section):
    # Labelled logs (Avazu, Criteo, OBD) become impressions plus clicks this much later (lognormal):
    click_delay_median_s: Positive = 30.0  # median impression -> click delay
    click_delay_sigma: NonNegative = 1.0  # lognormal shape of that delay
    click_delay_max_s: Seconds = 600.0  # cap; must not exceed joiner.attribution_window_s
    criteo_rows_per_s: Positive = 76.0  # Criteo has no timestamps: synthetic clock (45.8M rows in 7 days)
    criteo_start_ms: Natural = 1_767_225_600_000  # event time of Criteo's first row (2026-01-01Z)
    criteo_user_field: str = ""  # a C1..C26 column used as user id; empty = one anonymous user
    criteo_item_field: str = ""  # a C1..C26 column used as item id; empty = one anonymous item
    ftrl_alpha: Positive = 0.1  # FTRL baseline: per-coordinate learning-rate scale
    ftrl_beta: NonNegative = 1.0  # FTRL baseline: learning-rate smoothing
    ftrl_l1: NonNegative = 1.0  # FTRL baseline: L1 (sparsity)
    ftrl_l2: NonNegative = 1.0  # FTRL baseline: L2
    ftrl_batch_size: Count = 32  # FTRL baseline: rows per update (1 = the per-example textbook form)
    bootstrap_resamples: Natural = 200  # resamples for the AUC confidence intervals (seeded by --seed)
    register: bool = False  # publish every accepted version to the MLflow registry (slow, full lineage)


@dataclass(config=CHECKED, repr=False)
class JsonlConfig(Section):
    # Read-time renames for JSONL (and Parquet) logs in another vocabulary (sources/jsonl_mapping.py), as
    # "canonical=raw" pairs: "type=event_type" (the tag), "impression=imp" (a tag value), "user_id=uid".
    map: tuple[str, ...] = ()  # `--map` adds to these
    map_file: str = ""  # a JSON object of the same pairs ({"type": "event_type"}); empty = none


@dataclass(config=CHECKED, repr=False)
class DaemonConfig(Section):
    # the trainer's checkpoints, the joiner's Feast repository (its state: kafka.joiner_state_topic)
    state_dir: str = "~/.cache/ctr-online/state/daemons"
    checkpoint_every_s: Seconds = 5.0  # the joiner makes its output durable and commits this often
    # ... or less often when checkpoints are slow: they take at most this share of the joiner's time
    checkpoint_max_share: Share = 0.2
    # the garbage collector of the joiner, the trainer and the replay engine (pipeline/core/gc_tuning.py):
    # start-up objects frozen, a young collection every this many allocations; 0 = Python's (700)
    gc_gen0_threshold: Natural = 50_000
    idle_merge_s: Seconds = 2.0  # a partition's stream silent this long stops holding back the other
    dead_letter_warn_share: Share = 0.05  # the joiner warns when dead letters pass this share of a minute
    redis_url: str = "redis://127.0.0.1:16379/0"  # Feast online store and swap notifications
    metrics_host: str = "127.0.0.1"  # where the joiner's and the trainer's /metrics listen
    joiner_metrics_port: Port = 0  # GET /metrics of `ctr joiner` (Prometheus text); 0 = off
    trainer_metrics_port: Port = 0  # GET /metrics of `ctr trainer`; 0 = off (replicas: their own port)
    log_format: LogFormat = "text"  # text | json (one JSON object per line, for journald)
    replica_urls: tuple[str, ...] = ()  # the fleet's base URLs, for `ctr status` (comma-separated in env)


@dataclass(config=CHECKED, repr=False)
class Config(Section):
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
        """Plain dict of every value, secrets removed and URL passwords masked (for lineage and logs)."""
        out: dict[str, Any] = {}
        for sec in dataclasses.fields(self):
            values = dataclasses.asdict(getattr(self, sec.name))
            out[sec.name] = {k: masked(v) for k, v in values.items() if not isinstance(v, SecretStr)}
        return out
