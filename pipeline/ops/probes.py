"""Short-timeout probes of the services, for `ctr status` and the commands that need MLflow.

Each answers within :data:`TIMEOUT_S` or says why not, so one service down never hangs a command.
MLflow's own client retries a refused connection for minutes, with back-off, before it gives up:
`ctr versions`, `ctr rollback` and `ctr ab` ask :func:`registry_down` first.

>>> redact("redis://user:p4ss@h/1")
'redis://user:***@h/1'
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from typing import Any

from pipeline.core.config import Config

__all__ = ["TIMEOUT_S", "error_text", "http_json", "http_text", "mlflow_error", "redact", "registry_down"]

TIMEOUT_S = 2.0


def _open(url: str) -> Any:
    """``urlopen(url)``; credentials in it (``http://user:pw@host``) go as basic auth, by urllib's own
    handler (urlopen would take them for part of the host name)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return urllib.request.urlopen(url, timeout=TIMEOUT_S)
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    passwords = urllib.request.HTTPPasswordMgrWithPriorAuth()  # sent with the first request
    user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
    passwords.add_password(None, bare, user, password, is_authenticated=True)
    opener = urllib.request.build_opener(urllib.request.HTTPBasicAuthHandler(passwords))
    return opener.open(bare, timeout=TIMEOUT_S)


def http_json(url: str) -> Any:
    with _open(url) as resp:
        return json.loads(resp.read())


def http_text(url: str) -> str:
    with _open(url) as resp:
        return str(resp.read().decode())


def error_text(exc: BaseException) -> str:
    """``Type: message``, once (kafka-python's errors name their type themselves), at most 200 chars."""
    text, name = str(exc), type(exc).__name__
    return (text if text.startswith(name) else f"{name}: {text}")[:200]


def redact(url: str) -> str:
    """A URL without its password (status output ends up in tickets and chat)."""
    return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:***@", url)


def mlflow_error(uri: str) -> str | None:
    """Why the MLflow server at ``uri`` does not answer its health check, or None."""
    try:
        http_text(uri.rstrip("/") + "/health")
    except Exception as exc:
        return error_text(exc)
    return None


def registry_down(cfg: Config) -> str | None:
    """What to say when the MLflow server the registry commands need does not answer, else None
    (a local store, ``sqlite:///...``, is not probed)."""
    uri = cfg.registry.tracking_uri
    error = mlflow_error(uri) if uri.startswith("http") else None
    if error is None:
        return None
    return (
        f"MLflow at {redact(uri)} is not answering ({error}): start it (make services-up; on a "
        "host, systemctl start ctr-mlflow) or point CTR_REGISTRY_TRACKING_URI at it"
    )
