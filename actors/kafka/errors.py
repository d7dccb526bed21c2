"""Every exception `actors/kafka` raises on purpose. None of their texts holds a secret."""

from __future__ import annotations


class KafkaSettingError(ValueError):
    """A connection setting that cannot work: named, with what to do instead."""


class TokenUnavailable(RuntimeError):
    """No OAUTHBEARER token could be had: the file is missing or empty, or the command failed."""


class KafkaUnusable(Exception):
    """The connection cannot work as configured (bad credentials, an untrusted certificate, the
    wrong protocol for the port), or no broker answered within the connect timeout; retrying
    will not help. Its text is one line naming the cause."""
