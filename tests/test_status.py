"""`ctr status` without services: parsing, redaction, the screen, and nothing hangs when all is down.

The view over real services (Kafka lag, MLflow versions, replicas) is checked by
tests/integration/test_production_loop.py, against the replicas' own answers.
"""

from __future__ import annotations

import json
import logging
import socket
import time

from pipeline.core.config import Config
from pipeline.ops.cli import main
from pipeline.ops.probes import redact as _redact
from pipeline.ops.status import collect, parse_prometheus
from pipeline.ops.status_view import render


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _everything_down() -> Config:
    cfg = Config()
    port = _closed_port()  # nothing listens there: every probe is refused at once
    cfg.kafka.bootstrap_servers = f"127.0.0.1:{port}"
    cfg.daemon.redis_url = f"redis://:secret@127.0.0.1:{port}/0"
    cfg.registry.tracking_uri = f"http://127.0.0.1:{port}"
    cfg.daemon.joiner_metrics_port = port
    cfg.daemon.replica_urls = (f"http://127.0.0.1:{port}",)
    return cfg


def test_parse_prometheus_reads_labels_and_skips_comments() -> None:
    text = (
        "# HELP ctr_consumer_lag end - next\n# TYPE ctr_consumer_lag gauge\n"
        'ctr_consumer_lag{daemon="joiner",topic="a:b",partition="2"} 7.0\n'
        'ctr_serving_version{replica="r",version="12"} 12\n'
        "ctr_joiner_join_rate 0.94\nnot a sample\n"
    )
    assert parse_prometheus(text) == [
        ("ctr_consumer_lag", {"daemon": "joiner", "topic": "a:b", "partition": "2"}, 7.0),
        ("ctr_serving_version", {"replica": "r", "version": "12"}, 12.0),
        ("ctr_joiner_join_rate", {}, 0.94),
    ]


def test_passwords_never_reach_the_screen() -> None:
    assert _redact("redis://:p4ss@h:6379/0") == "redis://:***@h:6379/0"
    assert _redact("redis://user:p4ss@h/1") == "redis://user:***@h/1"
    assert _redact("redis://h:6379/0") == "redis://h:6379/0"


def test_everything_down_is_reported_not_raised() -> None:
    cfg = _everything_down()
    started = time.monotonic()
    status = collect(cfg)
    assert time.monotonic() - started < 60  # every probe has a short timeout (a hang would stop the test)
    assert {name: s["up"] for name, s in status["services"].items()} == {
        "kafka": False,
        "redis": False,
        "mlflow": False,
    }
    assert all(s["error"] for s in status["services"].values())
    assert status["consumers"] == {"error": "Kafka is down"}
    assert status["models"] == {"error": "MLflow is down"}
    assert status["daemons"]["joiner"]["up"] is False
    assert status["daemons"]["trainer"]["up"] is None  # port 0: not configured, said so
    assert [r["up"] for r in status["replicas"]] == [False]
    screen = render(status)
    for words in ("kafka    DOWN", "redis    DOWN", "mlflow   DOWN", "Kafka is down", "MLflow is down"):
        assert words in screen
    assert "secret" not in screen and "secret" not in json.dumps(status)


def test_cli_exits_non_zero_when_a_service_is_down(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = _everything_down()
    monkeypatch.setenv("CTR_KAFKA_BOOTSTRAP_SERVERS", cfg.kafka.bootstrap_servers)
    monkeypatch.setenv("CTR_DAEMON_REDIS_URL", cfg.daemon.redis_url)
    monkeypatch.setenv("CTR_REGISTRY_TRACKING_URI", cfg.registry.tracking_uri)
    monkeypatch.setenv("CTR_DAEMON_REPLICA_URLS", ",".join(cfg.daemon.replica_urls))
    assert main(["status", "--json"]) == 1
    status = json.loads(capsys.readouterr().out)
    assert status["replicas"][0]["url"] == cfg.daemon.replica_urls[0] and not status["replicas"][0]["up"]


def test_an_error_names_its_type_once() -> None:
    from kafka.errors import KafkaTimeoutError

    from pipeline.ops.probes import error_text as _error

    assert str(KafkaTimeoutError("Unable to bootstrap")).startswith("KafkaTimeoutError")  # its own
    assert _error(KafkaTimeoutError("Unable to bootstrap")) == "KafkaTimeoutError: Unable to bootstrap"
    assert _error(ConnectionError("refused")) == "ConnectionError: refused"


def test_the_status_screen_is_not_preceded_by_kafka_pythons_retries(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Its report says Kafka is down and why; kafka-python's own connection errors before it are
    noise to an operator (shown with -v)."""
    kafka_logger = logging.getLogger("kafka")
    level = kafka_logger.level
    monkeypatch.setattr("pipeline.ops.status.collect", lambda *args: {"services": {}})
    try:
        for argv, quiet in ((["status", "--json"], True), (["-v", "status", "--json"], False)):
            kafka_logger.setLevel(logging.NOTSET)
            main(argv)
            assert (kafka_logger.level == logging.CRITICAL) == quiet
    finally:
        kafka_logger.setLevel(level)


def test_render_shows_versions_lag_and_freshness() -> None:
    status = {
        "at": 0.0,
        "services": {"kafka": {"up": True, "url": "k:9092", "topics": 4}},
        "consumers": {"joiner": {"group": "g-joiner", "lag": {"imps:0": 5, "clicks:0": 0}, "total": 5}},
        "daemons": {
            "joiner": {"up": True, "url": "u", "events_per_second": 1234.5, "examples_per_second": 1100.0,
                       "join_rate": 0.9512, "events_total": 10.0, "dead_letters": 2.0,
                       "clicks": {"late": 3.0, "orphan": 1.0, "early": 4.0}},
        },
        "models": {
            "name": "ctr", "champion": "7", "challenger": None, "versions": 7,
            "last_blocks": [{"version": "7", "block": 7.0, "examples": 100000.0, "online_auc": 0.71,
                             "online_logloss": 0.2, "holdout_auc": 0.7, "block_closed_at": 5.0,
                             "gate": "ok"}],
        },
        "replicas": [{"url": "http://r:1", "up": True, "version": "7", "replica": "r", "last_swap_at": 8.5,
                      "freshness_s": 3.5}],
    }  # fmt: skip
    screen = render(status)
    assert "champion 7, challenger -, 7 versions" in screen
    assert "1,234 events/s in" in screen and "join rate 0.951" in screen
    assert "joiner   5" in screen
    assert "clicks: early 4, late 3, orphan 1" in screen
    assert "http://r:1" in screen and "version 7" in screen and "freshness 3.5 s" in screen


def test_a_health_check_sends_the_urls_credentials_as_basic_auth() -> None:
    """urllib takes ``user:pw@`` for part of the host name ("Name or service not known"): an MLflow
    behind basic auth was reported down by `ctr status` and refused by `ctr versions`."""
    import base64
    import http.server
    import threading

    from pipeline.ops.probes import mlflow_error

    seen: list[str | None] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            ok = self.path == "/health" and seen[-1] == "Basic " + base64.b64encode(b"ops:p@ss").decode()
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert mlflow_error(f"http://ops:p%40ss@127.0.0.1:{port}") is None
        assert mlflow_error(f"http://ops:wrong@127.0.0.1:{port}") == "HTTPError: HTTP Error 401: Unauthorized"
        assert mlflow_error(f"http://127.0.0.1:{port}/") == "HTTPError: HTTP Error 401: Unauthorized"
        assert seen[0] is not None and seen[-1] is None
    finally:
        server.shutdown()


def test_registry_commands_say_mlflow_is_down_at_once(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """MLflow's client retries a refused connection for minutes: the commands check first."""
    from pipeline.ops.probes import registry_down

    monkeypatch.setenv("CTR_REGISTRY_TRACKING_URI", "http://ops:secret@127.0.0.1:1")
    for argv in (["versions"], ["ab"], ["rollback", "--to", "3", "--reason", "bad"]):
        started = time.monotonic()
        assert main(argv) == 2
        assert time.monotonic() - started < 60  # no retry loop (a hang would stop the test)
        err = capsys.readouterr().err
        assert f"ctr {argv[0]}: MLflow at http://ops:***@127.0.0.1:1 is not answering" in err
        assert "secret" not in err and "CTR_REGISTRY_TRACKING_URI" in err
    cfg = Config()
    cfg.registry.tracking_uri = "sqlite:///runs/demo/mlflow.db"  # a local store: nothing to ask
    assert registry_down(cfg) is None
