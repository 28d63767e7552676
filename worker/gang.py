"""Gang start of a multi-node job: slots, the rendezvous endpoint, and waiting for all nodes.

The worker that claims a job with `nnodes > 1` takes slot 0, picks a free port for torchrun's
c10d rendezvous on its own address, records both as a `gang_slot` event, and sends
`nnodes - 1` more messages for the job. Each worker that receives one joins the current
attempt's gang (`jobs.store.leases.take_gang_slot`) and reads the endpoint from slot 0. Nobody
starts torchrun until every slot is taken; a gang that does not fill in time is an
infrastructure failure of the attempt (retried).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from jobs.store.engine import session_scope
from jobs.store.leases import gang_slots, job_attempt_status
from jobs.store.status import JobStatus


def free_port(host: str) -> int:
    """A TCP port free on `host` right now (torchrun's store binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host if host not in ("", "localhost") else "127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_gang(
    job_id: str,
    attempt: int,
    nnodes: int,
    timeout_s: float,
    keep_alive: Callable[[], bool] | None = None,
    poll_s: float = 0.5,
) -> bool:
    """Block until `nnodes` slots of this attempt are taken; False on timeout or when the
    job moved on (cancelled, another attempt) or `keep_alive` says stop."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with session_scope() as session:
            current = job_attempt_status(session, job_id)
            if current is None or current[0] != attempt:
                return False
            if current[1] not in (JobStatus.STARTING, JobStatus.RUNNING):
                return False
            if len(gang_slots(session, job_id, attempt)) >= nnodes:
                return True
        if keep_alive is not None and not keep_alive():
            return False
        time.sleep(poll_s)
    return False
