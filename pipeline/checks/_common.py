"""What every contract check shares: naming the implementation and the rule it broke."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

__all__ = ["ContractError", "fail", "impl_name", "within"]

_T = TypeVar("_T")


class ContractError(AssertionError):
    """An implementation broke a contract rule (an AssertionError, so pytest shows it as a failure)."""


def impl_name(obj: Any, name: str | None = None) -> str:
    """``name`` if given, else the implementation's class name."""
    return name or type(obj).__name__


def fail(impl: str, rule: str, detail: str) -> NoReturn:
    """Raise :class:`ContractError` as ``"<impl> breaks '<rule>': <detail>"``."""
    raise ContractError(f"{impl} breaks {rule!r}: {detail}")


def within(timeout_s: float, call: Callable[[], _T], impl: str, rule: str) -> _T:
    """``call()``'s result (or its exception), or a contract failure when it takes over ``timeout_s``.

    For calls that should fail fast but might be retried forever (a store treating a client error
    as an outage): the call runs in a daemon thread, which is left behind when it hangs.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread as is
            box["error"] = exc

    worker = threading.Thread(target=run, name=f"contract-{impl}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        fail(impl, rule, f"the call neither returned nor raised within {timeout_s:g} s (retried forever?)")
    if "error" in box:
        raise box["error"]
    return box["value"]
