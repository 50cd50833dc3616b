from __future__ import annotations

import pytest

from conveyor.client import ReconnectPolicy
from tests.client.faces import FACES

#: Fast reconnection for tests: a restarted server is found within ~0.2 s.
FAST_RECONNECT = ReconnectPolicy(delay_seconds=0.02, delay_max_seconds=0.2, timeout_seconds=30.0)


@pytest.fixture(params=sorted(FACES))
def face(request):
    """face(name, **client_kwargs) -> a connected-later client of the face under test
    (``sync``: Client, ``async``: AsyncClient); every one is disconnected at teardown."""
    made = []

    def make(name: str, **kwargs):
        kwargs.setdefault("reconnect", FAST_RECONNECT)
        client = FACES[request.param](name, **kwargs)
        made.append(client)
        return client

    make.kind = request.param
    yield make
    for client in made:
        try:
            client.disconnect()
        except Exception:
            pass
