"""`ctr deploy install`: lay out config, environment file, state folders and systemd units.

Layout under ``--prefix P`` (``P=/`` for a real host, a temporary folder to try it out):

- ``P/etc/ctr/ctr.toml``, ``ctr.env`` (secrets, mode 0600), ``kafka/`` (server.properties,
  log4j2.properties, kafka.env with the KRaft cluster id) -- files an operator edits are written
  once and kept on a re-install;
- ``P/var/lib/ctr/{daemons,kafka/data,kafka/logs,mlflow/artifacts}`` owned by ``--user``;
- ``P/lib/ctr/kafka-libs``: Kafka's jars, copied from ``--kafka-libs`` (what ``deploy/services.sh``
  fetched from Maven Central);
- the units of ``deploy/systemd`` with their ``@PLACEHOLDERS@`` filled in, in ``--unit-dir``
  (default ``P/etc/systemd/system``); they are regenerated on every install.

Every step is printed; ``--dry-run`` prints them and changes nothing. :func:`parse_env_file` reads
an environment file the way systemd's ``EnvironmentFile=`` does (the tests run the daemons with it).
"""

from __future__ import annotations

import base64
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["InstallOptions", "Installer", "parse_env_file", "render"]

TEMPLATES = Path(__file__).resolve().parents[2] / "deploy"
UNITS = ("ctr-kafka.service", "ctr-mlflow.service", "ctr-joiner.service", "ctr-trainer.service")
TEMPLATE_UNITS = ("ctr-serve@.service", "ctr.target")
_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def render(text: str, values: dict[str, str]) -> str:
    """Fill ``@NAME@`` placeholders; a placeholder without a value is a template bug: raise."""
    missing = sorted({m for m in _PLACEHOLDER.findall(text) if m not in values})
    if missing:
        raise KeyError(f"deploy: no value for placeholder(s) {missing}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's ``EnvironmentFile=`` reads them: ``#``/``;`` comments,
    blank lines, a trailing backslash continues a line, single or double quotes around a value
    are removed, no variable expansion.

    >>> parse_env_file('# c\\nA=1\\nB="two words"\\n C = x \\nD=a\\\\\\nb\\n')
    {'A': '1', 'B': 'two words', 'C': 'x', 'D': 'ab'}
    """
    out: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending = ""
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            continue  # systemd ignores (and logs) lines that are not assignments
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


@dataclass
class InstallOptions:
    prefix: Path
    user: str
    group: str | None = None  # default: the user's name
    unit_dir: Path | None = None  # default: <prefix>/etc/systemd/system
    venv: Path = Path(sys.prefix)  # the Python environment holding `ctr` and `mlflow`
    kafka_libs: Path | None = None  # Kafka's jars to copy; default: what deploy/services.sh fetched
    java: str = ""  # default: `java` on PATH, resolved
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    mlflow_port: int = 5000
    redis_url: str = "redis://127.0.0.1:6379/0"
    serve_ports: tuple[int, ...] = (8081, 8082)
    create_user: bool = False  # `useradd --system` the user when missing (root only)
    dry_run: bool = False
    templates: Path = TEMPLATES


@dataclass
class Installer:
    """Runs (or, dry, only prints) the steps of an install; ``done`` keeps the printed lines."""

    opts: InstallOptions
    out: Callable[[str], None] = print
    done: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        o = self.opts
        self.root = o.prefix.resolve()
        self.etc = self.root / "etc" / "ctr"
        self.state = self.root / "var" / "lib" / "ctr"
        self.libs = self.root / "lib" / "ctr" / "kafka-libs"
        self.unit_dir = (o.unit_dir or self.root / "etc" / "systemd" / "system").resolve()

    # -- steps -----------------------------------------------------------------------------------
    def _say(self, what: str) -> None:
        line = f"{'would ' if self.opts.dry_run else ''}{what}"
        self.done.append(line)
        self.out(line)

    def _note(self, what: str) -> None:
        """Something the operator has to do or know; printed the same with or without --dry-run."""
        self.done.append(f"note: {what}")
        self.out(f"note: {what}")

    def _mkdir(self, path: Path, owned: bool = False) -> None:
        self._say(f"mkdir {path}" + (f" (owner {self.opts.user})" if owned else ""))
        if not self.opts.dry_run:
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o750)
            if owned:
                self._chown(path)

    def _write(self, path: Path, text: str, mode: int = 0o644, keep: bool = False) -> None:
        if keep and path.exists():
            self._say(f"keep {path} (exists; delete it to regenerate)")
            return
        self._say(f"write {path} (mode {mode:o})")
        if not self.opts.dry_run:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            tmp.chmod(mode)
            os.replace(tmp, path)  # a unit or env file is never seen half-written

    def _chown(self, path: Path) -> None:
        if os.geteuid() != 0 or not self._user_exists():
            return  # a rehearsal as a normal user: ownership is the real install's business
        shutil.chown(path, self.opts.user, self.opts.group or self.opts.user)

    def _user_exists(self) -> bool:
        try:
            pwd.getpwnam(self.opts.user)
            return True
        except KeyError:
            return False

    # -- the install -----------------------------------------------------------------------------
    def values(self) -> dict[str, str]:
        o = self.opts
        java = o.java or shutil.which("java") or "/usr/bin/java"
        return {
            "PREFIX": str(self.root),
            "ETC": str(self.etc),
            "STATE": str(self.state),
            "USER": o.user,
            "GROUP": o.group or o.user,
            "VENV": str(o.venv),
            "JAVA": str(Path(java).resolve()) if Path(java).exists() else java,
            "KAFKA_LIBS": str(self.libs),
            "KAFKA_PORT": str(o.kafka_port),
            "KAFKA_CONTROLLER_PORT": str(o.kafka_controller_port),
            "KAFKA_DATA_DIR": str(self.state / "kafka" / "data"),
            "MLFLOW_PORT": str(o.mlflow_port),
            "REDIS_URL": o.redis_url,
            "SERVE_UNITS": " ".join(f"ctr-serve@{p}.service" for p in o.serve_ports),
            "REPLICA_URLS": ",".join(f"http://127.0.0.1:{p}" for p in o.serve_ports),
            # fresh per install; only used when the files holding them are first written
            "PSEUDONYM_KEY": secrets.token_hex(32),
            "KAFKA_CLUSTER_ID": base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="),
        }

    def run(self) -> list[str]:
        t, v = self.opts.templates, self.values()
        if not (t / "systemd").is_dir():
            raise FileNotFoundError(f"deploy: no unit templates in {t}/systemd; pass --templates")
        self._user_step()
        for d in (self.etc, self.etc / "kafka", self.unit_dir):
            self._mkdir(d)
        for sub in ("daemons", "kafka/data", "kafka/logs", "mlflow/artifacts"):
            self._mkdir(self.state / sub, owned=True)
        self._write(self.etc / "ctr.toml", render((t / "ctr.toml.example").read_text(), v), keep=True)
        self._write(self.etc / "ctr.env", render((t / "ctr.env.example").read_text(), v), 0o600, keep=True)
        kafka = t / "kafka"
        self._write(
            self.etc / "kafka" / "server.properties",
            render((kafka / "server.properties").read_text(), v),
            keep=True,
        )
        self._write(self.etc / "kafka" / "log4j2.properties", (kafka / "log4j2.properties").read_text())
        self._write(
            self.etc / "kafka" / "kafka.env", render((kafka / "kafka.env.example").read_text(), v), keep=True
        )
        self._kafka_libs()
        for name in UNITS + TEMPLATE_UNITS:
            self._write(self.unit_dir / name, render((t / "systemd" / name).read_text(), v))
        self._checks()
        self._next_steps()
        return self.done

    def _user_step(self) -> None:
        o = self.opts
        if self._user_exists():
            return
        cmd = ["useradd", "--system", "--home-dir", str(self.state), "--no-create-home"]
        cmd += ["--shell", "/usr/sbin/nologin", o.user]
        if o.create_user and os.geteuid() == 0:
            self._say(f"run {shlex.join(cmd)}")
            if not o.dry_run:
                subprocess.run(cmd, check=True)
        else:
            self._note(f"user {o.user} does not exist; create it with: {shlex.join(cmd)}")

    def _kafka_libs(self) -> None:
        src = self.opts.kafka_libs or Path.home() / ".cache" / "ctr-online" / "kafka-4.1.1" / "libs"
        jars = sorted(src.glob("*.jar")) if src.is_dir() else []
        if not jars:
            self._note(f"no Kafka jars in {src}: run deploy/services.sh up once, or pass --kafka-libs")
            return
        self._mkdir(self.libs)
        self._say(f"copy {len(jars)} jars from {src} to {self.libs}")
        if not self.opts.dry_run:
            for jar in jars:
                shutil.copy2(jar, self.libs / jar.name)

    def _checks(self) -> None:
        """Warn about what would make the units fail at start, instead of letting systemd find out."""
        o = self.opts
        if not (o.venv / "bin" / "ctr").exists():
            self._note(f"{o.venv}/bin/ctr is missing; pass --venv (the environment with ctr-online)")
        home = Path.home().resolve()
        if str(o.venv.resolve()).startswith(("/home/", "/root/", str(home) + "/")):
            self._note(
                f"the venv {o.venv} is in a home folder, which ProtectHome=yes hides from the "
                f"services: create one under {self.root} (python -m venv; pip install ctr-online)"
            )
        if not Path("/lib/systemd/system/redis-server.service").exists():
            self._note("Debian's redis-server.service is missing: apt-get install redis-server")

    def _next_steps(self) -> None:
        default_dir = Path("/etc/systemd/system")
        link = "" if self.unit_dir == default_dir else f"systemctl link {self.unit_dir}/ctr*; "
        serve = " ".join(f"ctr-serve@{p}" for p in self.opts.serve_ports)
        self.out(
            f"next: {link}systemctl daemon-reload; systemctl enable --now ctr.target\n"
            f"      (the target starts ctr-kafka, redis-server, ctr-mlflow, ctr-joiner, ctr-trainer, {serve})"
        )
