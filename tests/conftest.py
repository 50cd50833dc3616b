from __future__ import annotations

import pytest

from tests.serverproc import ServerProcess, write_config


@pytest.fixture
def server_factory(tmp_path):
    """Start real servers: server_factory(queues='<Queue>...</Queue>') -> ServerProcess."""
    started: list[ServerProcess] = []

    def make(**kwargs) -> ServerProcess:
        config = write_config(tmp_path, **kwargs)
        server = ServerProcess(config).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.kill()
