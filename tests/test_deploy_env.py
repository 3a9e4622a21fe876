"""`deploy/services.sh env` exports the names pipeline/core/config.py reads, with the services' addresses.

No service runs here: `env` only prints what `up` would start (ports from CTR_*_PORT).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from pipeline.core.config import Config

REPO = Path(__file__).resolve().parents[1]
SERVICES_SH = REPO / "deploy" / "services.sh"
# not the defaults (19092, 19093, 16379, 15000), which the config's own defaults happen to match
PORTS = {
    "CTR_KAFKA_PORT": "29092",
    "CTR_KAFKA_CONTROLLER_PORT": "29093",
    "CTR_REDIS_PORT": "26379",
    "CTR_MLFLOW_PORT": "25000",
}


def config_env_names() -> set[str]:
    """Every CTR_<SECTION>_<FIELD> name load_config reads."""
    cfg = Config()
    return {
        f"CTR_{sec.name.upper()}_{f.name.upper()}"
        for sec in dataclasses.fields(cfg)
        for f in dataclasses.fields(getattr(cfg, sec.name))
    }


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any CTR_ setting (a developer's shell may have some)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CTR_")} | extra


def test_every_exported_ctr_name_is_a_config_field() -> None:
    printed = subprocess.run(
        [str(SERVICES_SH), "env"], env=clean_env(), capture_output=True, text=True, timeout=60, check=True
    ).stdout
    exported = re.findall(r"^export (CTR_[A-Z0-9_]+)=", printed, flags=re.M)
    assert exported, printed
    unknown = set(exported) - config_env_names()
    assert not unknown, f"services.sh exports {sorted(unknown)}, which pipeline/core/config.py does not read"
    addresses = {"CTR_KAFKA_BOOTSTRAP_SERVERS", "CTR_DAEMON_REDIS_URL", "CTR_REGISTRY_TRACKING_URI"}
    assert addresses <= set(exported), exported


def test_eval_env_then_load_config_gives_the_services_addresses() -> None:
    """With non-default ports, so that a default that happens to match cannot pass the test."""
    code = (
        "import json, shutil; from pipeline.core.config_loader import load_config; c = load_config(); "
        "print(json.dumps([c.kafka.bootstrap_servers, c.daemon.redis_url, c.registry.tracking_uri, "
        "shutil.which('kafka-topics.sh')]))"
    )
    script = f'set -e; eval "$("{SERVICES_SH}" env)"; exec "{sys.executable}" -c "{code}"'
    env = clean_env(**PORTS)
    out = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    kafka, redis, mlflow, topics_tool = json.loads(out.stdout)
    assert kafka == "127.0.0.1:29092"
    assert redis == "redis://127.0.0.1:26379/0"
    assert mlflow == "http://127.0.0.1:25000"
    # and Kafka's own CLI is on PATH (deploy/kafka-cli.sh behind deploy/kafka/bin/*.sh)
    assert topics_tool == str(REPO / "deploy" / "kafka" / "bin" / "kafka-topics.sh")


def test_kafka_cli_knows_its_tools_without_a_broker() -> None:
    cli = str(REPO / "deploy" / "kafka-cli.sh")
    listed = subprocess.run([cli, "--list"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert "kafka-topics             org.apache.kafka.tools.TopicCommand" in listed
    assert "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand" in listed
    for link in (REPO / "deploy" / "kafka" / "bin").glob("*.sh"):  # every link names a known tool
        assert link.resolve() == REPO / "deploy" / "kafka-cli.sh", link
        assert link.name.removesuffix(".sh") in listed, link
    bad = subprocess.run([cli, "kafka-nope"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown tool 'kafka-nope'" in bad.stderr


def test_local_broker_deletes_nothing_by_time() -> None:
    """Replays produce with the event time as CreateTime: time-based retention would delete them."""
    props = dict(
        line.split("=", 1)
        for line in (REPO / "deploy" / "kafka" / "server.properties").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert props["log.retention.ms"] == "-1"
    assert not {"log.retention.hours", "log.retention.minutes"} & props.keys()
