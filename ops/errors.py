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


class KafkaRuntimeUnavailable(OpsError):
    """The local broker cannot be run: no suitable JDK, or its jars cannot be resolved."""


class JavaNotFound(KafkaRuntimeUnavailable):
    """No `java` (JAVA_HOME or PATH), or one older than the broker needs."""


class MavenError(KafkaRuntimeUnavailable):
    """Maven is missing or could not fetch the broker's jars from Maven Central."""


class KafkaStartError(OpsError):
    """The local broker did not start, or did not answer in time."""


class TopicCreateError(OpsError):
    """The broker refused to create a topic for a reason other than that it exists."""


class SubmitError(OpsError):
    """`tokenmill submit` cannot reach its topics."""


class CancelError(OpsError):
    """Cancel records could not be sent: no broker, or no cancel topic."""


class BatchOutputBusy(OpsError):
    """Another `tokenmill batch run` holds the output file."""


class JaegerBuildError(OpsError):
    """Jaeger could not be built with Go (no `go`, or the build failed)."""


class JaegerStartError(OpsError):
    """The local Jaeger did not start, or its query API did not answer in time."""


class JaegerQueryError(OpsError):
    """Jaeger's query API could not be reached or answered with an error."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
