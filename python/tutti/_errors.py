"""The exceptions tutti raises.

Every error from the core is a :class:`TuttiError` (a ``RuntimeError``) carrying the
core's message, which names the op, its sequence number, this rank and the peers
involved. Subclasses say what happened, and several also derive from the matching
built-in, so ``except TimeoutError`` or ``except ValueError`` catch them too.

Errors about the arguments detected before anything is sent (a list where an array
is needed, a non-contiguous array, an unsupported dtype) are plain ``TypeError`` and
``ValueError``.
"""

import builtins


class TuttiError(RuntimeError):
    """Base class of every error from the tutti core. Its message starts with ``tutti:``."""

    def __str__(self) -> str:
        s = super().__str__()
        return s if s.startswith("tutti") else "tutti: " + s


class TimeoutError(TuttiError, builtins.TimeoutError):  # noqa: A001 - deliberately shadows
    """An op missed its deadline. Attributes: ``op``, ``seq``, ``rank``, ``waiting_for``
    (the ranks that did not arrive) and ``after`` (seconds). The communicator is poisoned:
    every later op fails too."""


class PeerLostError(TuttiError, ConnectionError):
    """A peer process died or its connection broke. Attributes: ``rank``, ``peer``, ``op``,
    ``seq``. The communicator is poisoned: every pending and later op fails fast."""


class MismatchError(TuttiError):
    """Ranks called different collectives, or the same one with different arguments
    (type, reduction, count). Attributes: ``rank``, ``peer``, ``seq``."""


class SizeMismatchError(TuttiError, ValueError):
    """A point-to-point message and the receive that matched it differ in size (the
    message is longer than the receive buffer, or an exact receive got another length).
    Both the sender and the receiver get it; nothing was transferred, and the
    communicator stays usable. Attributes: ``rank`` (this one), ``peer`` (the other
    side), ``tag``, ``message`` and ``buffer`` (their sizes in bytes)."""


class AbortedError(TuttiError):
    """The communicator was aborted (``Communicator.abort()``)."""


class InvalidArgumentError(TuttiError, ValueError):
    """The core rejected an argument: a buffer of the wrong size, a root or peer out of range."""


class ConfigError(TuttiError):
    """The environment or configuration is wrong or incomplete (a ``TUTTI_*`` variable,
    missing launcher variables)."""


class BootstrapError(TuttiError, ConnectionError):
    """Setting up a communicator failed: rendezvous, connections or shared memory.
    Attribute: ``rank``."""


class IoError(TuttiError, OSError):
    """An operating-system call failed."""


__all__ = [
    "TuttiError",
    "TimeoutError",
    "PeerLostError",
    "MismatchError",
    "SizeMismatchError",
    "AbortedError",
    "InvalidArgumentError",
    "ConfigError",
    "BootstrapError",
    "IoError",
]
