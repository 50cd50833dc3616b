"""The Jobs/FailedJobs example of spec 000 ("Handling Unprocessed Messages") on the real
server: a message cancelled three times lands in FailedJobs, and survives a SIGKILL."""

from pathlib import Path

from conveyor import Client
from tests.serverproc import ServerProcess
from tests.settle import barrier, buffered

EXAMPLE = (Path(__file__).resolve().parent.parent / "config" / "examples" / "jobs_actions.xml").read_text()
TRANSPORT = "<AMPSConfig>\n<Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr><Protocol>amps</Protocol></Transport></Transports>"


def test_jobs_failed_jobs_example(tmp_path):
    config = tmp_path / "config.xml"
    config.write_text(EXAMPLE.replace("./journals", str(tmp_path / "journals")).replace("<AMPSConfig>", TRANSPORT, 1))
    server = ServerProcess(config).start()
    try:
        with Client("submitter").connect(server.uri) as client:
            client.publish("Jobs", {"job": 1, "frames": 240})
            client.flush()
        with Client("worker").connect(server.uri) as client:
            jobs = client.subscribe("Jobs")
            for _ in range(3):
                msg = jobs.get(timeout=5)
                assert msg.json()["job"] == 1
                msg.cancel()
                client.flush()
            barrier(client)
            assert buffered(jobs) == []  # expired on the third cancel: not redelivered
        server.kill()
        server.restart()
        with Client("reviewer").connect(server.uri) as client:
            failed = client.subscribe("FailedJobs")
            msg = failed.get(timeout=5)
            assert msg.json() == {"message": {"job": 1, "frames": 240}, "reason": "max_cancels"}
            msg.ack()
            client.flush()
            assert client.sow("Jobs") == []
    finally:
        server.kill()
