"""sd_notify without dependencies: tell systemd a daemon is ready, alive, or stopping.

The protocol (``man sd_notify``) is one datagram of ``KEY=VALUE`` lines to the ``AF_UNIX`` socket
named by ``$NOTIFY_SOCKET`` (a leading ``@`` means Linux's abstract namespace). Outside systemd the
variable is unset and every call here is a no-op, so the daemons call these unconditionally.

- :func:`ready` -- ``READY=1``: sent once the daemon can do its job (``Type=notify`` waits for it);
- :func:`watchdog` -- ``WATCHDOG=1`` from each main-loop iteration, throttled to half of
  ``$WATCHDOG_USEC`` (systemd restarts a unit whose pings stop for ``WatchdogSec``);
- :func:`stopping` -- ``STOPPING=1`` when SIGTERM arrives;
- :func:`status` -- ``STATUS=...``: one line that ``systemctl status`` shows;
- :func:`extend_timeout` -- ``EXTEND_TIMEOUT_USEC=...``: more time to start (a slow dependency).

>>> Notifier(env={}).ready()  # no NOTIFY_SOCKET: nothing is sent
False
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping

__all__ = ["Notifier", "extend_timeout", "notifier", "ready", "status", "stopping", "watchdog"]


class Notifier:
    """Sends notifications to the socket in ``env`` (default ``os.environ``); thread-safe."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        # '@name' is an abstract socket: the kernel wants a leading NUL byte instead of the '@'
        self.address = "\0" + path[1:] if path.startswith("@") else path
        self.watchdog_s = self._watchdog_interval(env)
        self._last_ping = -float("inf")
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    @staticmethod
    def _watchdog_interval(env: Mapping[str, str]) -> float | None:
        """``$WATCHDOG_USEC`` in seconds, if the watchdog is meant for this process."""
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if not usec.isdigit() or int(usec) == 0:
            return None
        if pid and pid != str(os.getpid()):  # set for a parent (e.g. a wrapper script), not for us
            return None
        return int(usec) / 1e6

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` as one datagram; True if sent. Never raises: systemd going away (or a
        full socket buffer) must not take the daemon down with it."""
        if not self.address:
            return False
        data = "\n".join(fields).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(data, self.address)
                return True
            except OSError:
                return False

    def ready(self, text: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={text}"] if text else []))

    def watchdog(self, now: float | None = None) -> bool:
        """``WATCHDOG=1`` at most every half watchdog interval (the main loop calls it freely)."""
        if self.watchdog_s is None or not self.address:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_ping < self.watchdog_s / 2:
            return False
        self._last_ping = now
        return self.notify("WATCHDOG=1")

    def stopping(self, text: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={text}"] if text else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={' '.join(text.splitlines())}")

    def extend_timeout(self, seconds: float) -> bool:
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


_default: Notifier | None = None


def notifier() -> Notifier:
    """The process-wide notifier, built from the environment on first use."""
    global _default
    if _default is None:
        _default = Notifier()
    return _default


def ready(text: str | None = None) -> bool:
    return notifier().ready(text)


def watchdog() -> bool:
    return notifier().watchdog()


def stopping(text: str | None = None) -> bool:
    return notifier().stopping(text)


def status(text: str) -> bool:
    return notifier().status(text)


def extend_timeout(seconds: float) -> bool:
    return notifier().extend_timeout(seconds)
