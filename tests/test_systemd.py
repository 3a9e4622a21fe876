"""sd_notify over a real socket, `ctr deploy install`, and `systemd-analyze verify` on every unit."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.config_loader import load_config
from pipeline.core.systemd import Notifier
from pipeline.ops.cli import main
from pipeline.ops.deploy import TEMPLATE_UNITS, UNITS, Installer, InstallOptions, parse_env_file

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------- sd_notify
@pytest.fixture(params=["path", "abstract"])
def notify_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket standing in for systemd's; yields the NOTIFY_SOCKET value for it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        sock.bind(str(tmp_path / "notify"))
        name = str(tmp_path / "notify")
    else:
        name = f"@ctr-test-{os.getpid()}-{id(sock)}"
        sock.bind("\0" + name[1:])
    sock.settimeout(2)
    yield name, sock
    sock.close()


def test_notify_sends_each_message_as_one_datagram(notify_socket: tuple[str, socket.socket]) -> None:
    name, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": name})
    assert n.ready("joiner: consuming") and n.status("two\nlines") and n.stopping()
    assert sock.recv(4096) == b"READY=1\nSTATUS=joiner: consuming"
    assert sock.recv(4096) == b"STATUS=two lines"
    assert sock.recv(4096) == b"STOPPING=1"
    n.close()


def test_watchdog_pings_at_most_every_half_interval(notify_socket: tuple[str, socket.socket]) -> None:
    name, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())})
    sent = [n.watchdog(now=t) for t in (100.0, 101.0, 104.9, 105.0, 106.0, 110.0)]
    assert sent == [True, False, False, True, False, True]
    assert [sock.recv(64) for _ in range(3)] == [b"WATCHDOG=1"] * 3


def test_no_socket_or_a_foreign_watchdog_means_no_op(tmp_path: Path) -> None:
    assert not Notifier({}).ready()
    assert not Notifier({"WATCHDOG_USEC": "1000000"}).watchdog()
    other = Notifier({"NOTIFY_SOCKET": str(tmp_path / "s"), "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_s is None  # the watchdog was meant for another process
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}).ready()  # never raises


# ------------------------------------------------------------------------------------ deploy install
def _install(prefix: Path, **kw: object) -> Installer:
    opts = InstallOptions(prefix=prefix, user="ctr-test", kafka_libs=prefix / "no-jars", **kw)  # type: ignore[arg-type]
    inst = Installer(opts, out=lambda _: None)
    inst.run()
    return inst


def test_dry_run_prints_every_step_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = tmp_path / "root"
    assert main(["deploy", "install", "--prefix", str(prefix), "--user", "ctr", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert not prefix.exists()
    for name in (*UNITS, *TEMPLATE_UNITS, "ctr.env", "ctr.toml", "server.properties"):
        assert f"would write {prefix}" in out and name in out
    assert "systemctl enable --now ctr.target" in out


def test_install_lays_out_a_prefix_whose_config_the_daemons_can_load(tmp_path: Path) -> None:
    inst = _install(tmp_path, kafka_port=29092, serve_ports=(9001, 9002))
    units = {p.name: p.read_text() for p in inst.unit_dir.iterdir()}
    assert set(units) == {*UNITS, *TEMPLATE_UNITS}
    for text in (*units.values(), *(p.read_text() for p in inst.etc.rglob("*") if p.is_file())):
        assert not re.search(r"@[A-Z_]+@", text)  # every placeholder filled
    assert "Wants=ctr-serve@9001.service ctr-serve@9002.service" in units["ctr.target"]
    assert (
        f"ExecStart={sys.prefix}/bin/ctr --config {inst.etc}/ctr.toml --verbose joiner"
        in units["ctr-joiner.service"]
    )
    env_file = inst.etc / "ctr.env"
    assert env_file.stat().st_mode & 0o777 == 0o600  # secrets
    env = parse_env_file(env_file.read_text())
    assert len(env["CTR_VALIDATION_PSEUDONYM_KEY"]) == 64
    cfg = load_config(inst.etc / "ctr.toml", env=env)
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:29092"  # the config's name, not services.sh's
    assert cfg.daemon.state_dir == str(inst.state / "daemons")
    assert cfg.validation.pseudonym_key.get_secret_value() == env["CTR_VALIDATION_PSEUDONYM_KEY"]
    assert (inst.state / "kafka" / "data").is_dir() and (inst.state / "mlflow" / "artifacts").is_dir()


def test_reinstall_keeps_secrets_and_edits_but_regenerates_units(tmp_path: Path) -> None:
    first = _install(tmp_path)
    env_before = (first.etc / "ctr.env").read_text()
    cluster_id = (first.etc / "kafka" / "kafka.env").read_text()
    (first.unit_dir / "ctr-joiner.service").write_text("stale")
    second = _install(tmp_path)
    assert (second.etc / "ctr.env").read_text() == env_before
    assert (second.etc / "kafka" / "kafka.env").read_text() == cluster_id
    assert (second.unit_dir / "ctr-joiner.service").read_text().startswith("# `ctr joiner`")
    assert any(line.startswith("keep ") and "ctr.env" in line for line in second.done)


def test_env_file_parsing_follows_systemd() -> None:
    text = "# comment\n; also\nA=1\nB=\"two words\"\nC='x y'\n  D = spaced  \nE=a\\\nb\nnot a line\nF=\n"
    assert parse_env_file(text) == {"A": "1", "B": "two words", "C": "x y", "D": "spaced", "E": "ab", "F": ""}


# ------------------------------------------------------------------------------- systemd-analyze
def _systemd_analyze() -> str | None:
    """systemd-analyze, installed from Debian's `systemd` package when missing and we may."""
    found = shutil.which("systemd-analyze")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    install = "apt-get install -y -q --no-install-recommends systemd"
    cmd = f"{install} || (apt-get update -q && {install})"
    subprocess.run(["sh", "-c", cmd], capture_output=True, timeout=600, check=False)
    return shutil.which("systemd-analyze")


@pytest.mark.parametrize("unit", [*UNITS, "ctr.target", "ctr-serve@.service", "ctr-serve@8081.service"])
def test_systemd_analyze_verify_passes_without_a_warning(tmp_path: Path, unit: str) -> None:
    analyze = _systemd_analyze()
    if analyze is None:
        pytest.skip("systemd-analyze is missing and Debian's systemd package could not be installed here")
    inst = _install(tmp_path)
    # verify checks that ExecStart= binaries exist: java is the one the machine may lack
    if "kafka" in unit and not Path(inst.values()["JAVA"]).exists():
        pytest.skip("no java on this machine: ctr-kafka.service's ExecStart cannot be checked")
    proc = subprocess.run(
        [analyze, "verify", "--man=no", unit], cwd=inst.unit_dir, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and not proc.stderr.strip() and not proc.stdout.strip(), proc.stderr
