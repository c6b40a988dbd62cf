"""A real S3-protocol server on loopback for the tests: moto's server mode, as s3fs's own test
suite runs it, started as its own process and stopped with the test module."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from unittest import mock

# Credentials the server accepts; the tests check that none of them reach a file or message.
ACCESS_KEY = "notebookkitaccesskey"
SECRET_KEY = "notebookkit-secret-never-shown"


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    @property
    def options(self) -> dict[str, object]:
        """``storage_options`` for s3fs that reach this server."""
        return {"client_kwargs": {"endpoint_url": self.endpoint}}

    def filesystem(self):  # an s3fs.S3FileSystem of this server, for setting up and looking
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.options)

    def make_bucket(self, name: str) -> str:
        self.filesystem().mkdir(name)
        return name


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's S3 server on a free loopback port, with this process's credentials set."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.2)
        environment = {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        with mock.patch.dict(os.environ, environment):
            yield S3Server(endpoint)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
