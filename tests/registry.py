"""A real OCI registry for the tests: Debian's docker-registry (the distribution v2 server) on
loopback, plain or with basic auth over TLS under a CA made for the occasion."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
from pathlib import Path

from orchestrator.cli.local import free_port


class Registry:
    """One registry process; `host` is ADDRESS:PORT. With `user`, it wants basic auth over TLS."""

    def __init__(self, root: Path, user: str = "", password: str = "", address: str = "127.0.0.1") -> None:
        self.root = root
        self.address = address
        self.port = free_port(address)
        self.host = f"{address}:{self.port}"
        self.user, self.password = user, password
        root.mkdir(parents=True, exist_ok=True)
        config = {
            "version": 0.1,
            "log": {"level": "error"},
            "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
            "http": {"addr": self.host, "secret": "stasis-tests"},
        }
        if user:
            self._make_tls()
            subprocess.run(
                ["htpasswd", "-Bbc", str(root / "htpasswd"), user, password], check=True, capture_output=True
            )
            config["http"]["tls"] = {"certificate": str(root / "server.crt"), "key": str(root / "server.key")}  # type: ignore[index]
            config["auth"] = {"htpasswd": {"realm": "stasis", "path": str(root / "htpasswd")}}
        (root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = root / "registry.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                ["docker-registry", "serve", str(root / "config.yml")], stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex((address, self.port)) == 0:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"docker-registry did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def _make_tls(self) -> None:
        """A CA, and a server certificate for the registry's address signed by it."""
        r = self.root
        run = lambda *argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=stasis-test-ca",
            "-keyout", str(r / "ca.key"), "-out", str(r / "ca.crt"))  # fmt: skip
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={self.address}",
            "-keyout", str(r / "server.key"), "-out", str(r / "server.csr"))  # fmt: skip
        (r / "ext.cnf").write_text(f"subjectAltName=IP:{self.address}\n")
        run("openssl", "x509", "-req", "-in", str(r / "server.csr"), "-CA", str(r / "ca.crt"), "-CAkey",
            str(r / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(r / "ext.cnf"),
            "-out", str(r / "server.crt"))  # fmt: skip

    def certs_dir(self) -> Path:
        """The node setting for this registry's CA: <dir>/<host:port>/ca.crt."""
        d = self.root / "certs.d"
        (d / self.host).mkdir(parents=True, exist_ok=True)
        (d / self.host / "ca.crt").write_bytes((self.root / "ca.crt").read_bytes())
        return d

    def auth_file(self, password: str | None = None) -> Path:
        """A docker config.json with this registry's credentials (or a wrong password)."""
        token = base64.b64encode(
            f"{self.user}:{self.password if password is None else password}".encode()
        ).decode()
        path = self.root / f"auth-{password or 'right'}.json"
        path.write_text(json.dumps({"auths": {self.host: {"auth": token}}}))
        return path

    def push(self, layout: Path, tag: str, repository: str, version: str = "1") -> str:
        """Copy an OCI layout's image into the registry; returns its reference."""
        ref = f"{self.host}/{repository}:{version}"
        argv = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if self.user:
            argv = ["skopeo", "copy", "--quiet", "--dest-cert-dir", str(self.certs_dir() / self.host),
                    "--dest-creds", f"{self.user}:{self.password}"]  # fmt: skip
        subprocess.run([*argv, f"oci:{layout}:{tag}", f"docker://{ref}"], check=True, capture_output=True)
        return ref

    def blobs(self) -> Path:
        return self.root / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
