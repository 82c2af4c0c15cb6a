"""A real S3-compatible server for the tests: moto's standalone server, on loopback."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

from orchestrator.cli.local import free_port

# moto's server with its WSGI app behind one that drops If-None-Match, as an endpoint (or a
# proxy before it) that does not support conditional writes does: PUTs then always replace.
_IGNORING_IF_NONE_MATCH = """
import sys
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

moto = DomainDispatcherApplication(create_backend_app)

def app(environ, start_response):
    environ.pop("HTTP_IF_NONE_MATCH", None)
    return moto(environ, start_response)

run_simple("127.0.0.1", int(sys.argv[1]), app, threaded=True, request_handler=MotoRequestHandler)
"""


class MotoServer:
    """A real moto S3 server process on 127.0.0.1 (the one S3 endpoint this machine can run).

    `honours_if_none_match=False` puts a front before it that drops the header, so it stands
    for an endpoint without conditional writes."""

    def __init__(self, honours_if_none_match: bool = True) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        if honours_if_none_match:
            argv = ["-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        else:
            argv = ["-c", _IGNORING_IF_NONE_MATCH, str(self.port)]
        self.process = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def create_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=name)
        client.close()
