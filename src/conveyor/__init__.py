"""conveyor: durable message queues over a transaction log."""

__version__ = "0.1.0"

# First: whether this process runs the compiled modules or their sources
# (conveyor/native.py), decided before any of them is imported.
from conveyor import native as _native  # noqa: E402

_native.choose()


def __getattr__(name: str):
    # Lazy, so importing conveyor.engine does not import the client (layering rule).
    if name in ("Client", "AsyncClient", "Message"):
        from conveyor import client

        return getattr(client, name)
    raise AttributeError(name)
