"""One base exception for the project; each subclass names a kind of failure a caller can act on."""

from __future__ import annotations


class ElasticError(Exception):
    """Base of every error slurm-elastic raises on purpose."""


class ConfigError(ElasticError):
    """A configuration value is invalid; the message names the field, the value and what is valid."""


class ProtocolError(ElasticError):
    """A control message was malformed, too large or out of order."""


class InvalidMessage(ProtocolError):
    """One whole frame that is not a valid message: the frame is dropped, the connection stays usable."""


class AuthError(ProtocolError):
    """A control connection did not prove that it holds the job's secret."""


class HandshakeRefused(AuthError):
    """A peer failed the coordinator's handshake. Its message is a fixed category, never anything the peer
    sent: an unauthenticated peer's bytes reach no event, log line or terminal."""

    def __init__(self, category: str) -> None:
        super().__init__(f"handshake refused: {category}")
        self.category = category


class SlurmError(ElasticError):
    """A Slurm command failed or Slurm is not reachable."""


class SlurmParseError(SlurmError):
    """Slurm printed something the parser does not understand."""


class DataError(ElasticError):
    """A data set or data source is missing or malformed."""


class JobFailed(ElasticError):
    """The training job stopped for good (for example after repeated identical failures)."""


class StateLost(ElasticError):
    """Some of the training state has no live, trusted holder (both holders of a shard lost): the job must
    resume from its disaster-recovery checkpoint."""


class UsageError(ElasticError):
    """The training script used ElasticJob in a way it does not support (the message says what is valid).
    Raised where the misuse happens; a worker that hits one exits non-zero and the job fails."""
