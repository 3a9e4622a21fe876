"""Pseudonyms: personal identifiers replaced by a keyed hash, the same everywhere they appear.

User ids and the configured device/IP feature values are replaced at ingest by a keyed BLAKE2b hash
(a MAC: without the key the pseudonym cannot be recomputed from a guessed id); the same key gives
the same pseudonym, so joins hold, and serving hashes request ids the same way.

>>> p = Pseudonymizer("k")
>>> p("alice") == p("alice") != p("bob") and p("alice").startswith("u_")
True
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["Pseudonymizer", "identifier_pattern"]


class Pseudonymizer:
    """Keyed hash of personal identifiers; the same key gives the same pseudonym, so joins hold."""

    def __init__(self, key: str, prefix: str = "u_") -> None:
        if not key:
            raise ValueError("pseudonym key is empty: set CTR_VALIDATION_PSEUDONYM_KEY")
        self._key = hashlib.sha256(key.encode()).digest()  # blake2b keys are at most 64 bytes
        self._prefix = prefix
        self._cache: dict[str, str] = {}

    def __call__(self, ident: str) -> str:
        out = self._cache.get(ident)
        if out is None:
            # surrogatepass: a lone surrogate (from JSON "\\ud800") still hashes, never raises
            data = ident.encode("utf-8", "surrogatepass")
            digest = hashlib.blake2b(data, key=self._key, digest_size=10).hexdigest()
            out = self._prefix + digest
            if len(self._cache) > 1_000_000:  # bound memory on high-cardinality streams
                self._cache.clear()
            self._cache[ident] = out
        return out


def identifier_pattern(pii: frozenset[str]) -> re.Pattern[str]:
    """``"name": value`` for user_id and the PII keys: a (possibly cut off) string, or a bare token."""
    names = "|".join(re.escape(n) for n in sorted({"user_id", *pii}))
    return re.compile(rf'"({names})"\s*:\s*("(?:[^"\\]|\\.)*(?:"|$)|[^,}}\s]+)')
