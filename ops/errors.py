"""Every exception `ops/` raises on purpose, in one place.

The CLI turns these into a one-line message and a non-zero exit; each message says what to do.
"""

from __future__ import annotations


class OpsError(Exception):
    """Base class of everything `ops/` raises on purpose."""


class ModelFetchError(OpsError):
    """A model cannot be resolved or fetched into the local cache."""


class UnknownModel(ModelFetchError):
    """The name is neither a known alias nor an existing path."""


class ModelDownloadError(ModelFetchError):
    """The package index or the file host could not be reached or answered badly."""


class ModelIntegrityError(ModelFetchError):
    """A downloaded file does not match its pinned hash or size."""
