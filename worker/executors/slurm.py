"""The SLURM executor: an attempt becomes one `sbatch` job that runs `srun torchrun`.

The worker runs on a submit node. For each attempt it writes `<run_dir>/slurm-a<N>.sbatch`
(nodes, one task per node, GPUs per node, partition, account, QOS and time limit from the
job's resources and the worker's `TUNEYARD_WORKER_SLURM_*` settings; `--signal=TERM@<s>` so
the trainer checkpoints before the limit), submits it, and follows it with `scontrol show
job` (kept for `MinJobAge` after it ends; `sacct` when that has forgotten it). The batch
script runs one `torchrun` per node through `srun` with a c10d rendezvous on the first node,
so SLURM, not tuneyard's gang slots, allocates the nodes; the run directory must be on a
filesystem every node sees. Output goes to `<run_dir>/slurm-a<N>.out/.err`, followed like
a local process's pipes. SLURM's end states map onto the outcome catalogue: COMPLETED and
FAILED by exit code, TIMEOUT and PREEMPTED as a preemption (a new attempt resumes from
LATEST), NODE_FAIL/BOOT_FAIL as a retried infrastructure fault, OUT_OF_MEMORY as the user
error it is. Jobs are submitted `--no-requeue`: a retry is always a new tuneyard attempt.
An sbatch that cannot reach the controller (restarting, busy) raises `LaunchUnavailable`,
which the supervisor asks again for a while; a refusal of the job itself fails it at once.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from jobs.orchestration.policy import Outcome, Verdict
from jobs.recipe.exit_codes import ExitCode
from worker.config import WorkerConfig
from worker.executors.base import LaunchUnavailable
from worker.launcher import LaunchSpec, build_env, torchrun_prefix

ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
        "STOPPED",
    }
)
# Variables of the worker's environment the trainer may need on the compute nodes; the
# database and broker URLs (credentials) never go into a batch script.
PASSED_PREFIXES = ("HF_", "TRANSFORMERS_", "NCCL_", "TORCH_", "CUDA_", "OMP_", "PYTORCH_")
PASSED_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CACHE_HOME", "TUNEYARD_HOME")
COMMAND_TIMEOUT_S = 30.0
# What sbatch says when the controller, not the job, is the problem: slurmctld restarting,
# unreachable or too busy. Anything else (a bad partition, account or size) is final.
CONTROLLER_UNAVAILABLE = re.compile(
    r"unable to contact slurm controller|socket timed out|resource temporarily unavailable"
    r"|temporarily unable to accept|zero bytes were transmitted|communication connection"
    r" failure|connection refused|in standby mode|slurmctld.*not responding",
    re.IGNORECASE,
)


def job_name(job_id: str, attempt: int) -> str:
    return f"ty-{job_id}-a{attempt}"


def rendezvous_port(job_id: str, attempt: int) -> int:
    """A port that differs between jobs (and attempts) sharing a first node."""
    return 20000 + (zlib.crc32(f"{job_id}:{attempt}".encode()) % 20000)


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)


def _exports(spec: LaunchSpec, cpus_per_task: int) -> dict[str, str]:
    env = build_env(spec)
    passed = {k: v for k, v in env.items() if k in PASSED_NAMES or k.startswith(PASSED_PREFIXES)}
    tuneyard = {k: v for k, v in env.items() if k not in os.environ or os.environ[k] != v}
    out = {**passed, **tuneyard}
    out["OMP_NUM_THREADS"] = str(max(1, cpus_per_task // max(1, spec.nproc_per_node)))
    if spec.accelerator == "cuda":
        out.pop("CUDA_VISIBLE_DEVICES", None)  # SLURM sets it from the node's GPU allocation
    return out


def cpus_per_task(spec: LaunchSpec, config: WorkerConfig) -> int:
    """One CPU per CPU rank; `slurm_cpus_per_gpu` per GPU rank."""
    per_rank = config.slurm_cpus_per_gpu if spec.accelerator == "cuda" else 1
    return spec.nproc_per_node * per_rank


def sbatch_directives(spec: LaunchSpec, config: WorkerConfig, run_dir: Path) -> list[str]:
    cuda = spec.accelerator == "cuda"
    cpus = cpus_per_task(spec, config)
    stem = run_dir / f"slurm-a{spec.attempt}"
    options = {
        "job-name": job_name(spec.job_id, spec.attempt),
        "nodes": str(spec.nnodes),
        "ntasks-per-node": "1",
        "cpus-per-task": str(cpus),
        "gpus-per-node": str(spec.nproc_per_node) if cuda else "",
        "partition": config.slurm_partition,
        "account": config.slurm_account,
        "qos": config.slurm_qos,
        "time": config.slurm_time_limit,
        "mem": config.slurm_mem,
        "signal": f"TERM@{config.slurm_signal_seconds}",
        "output": f"{stem}.out",
        "error": f"{stem}.err",
        "chdir": str(run_dir),
        "export": "NONE",
    }
    lines = [f"#SBATCH --{key}={shlex.quote(value)}" for key, value in options.items() if value]
    lines.append("#SBATCH --no-requeue")
    lines += [f"#SBATCH {shlex.quote(arg)}" for arg in shlex.split(config.slurm_extra_args)]
    return lines


def batch_script(spec: LaunchSpec, config: WorkerConfig, run_dir: Path) -> str:
    """The whole sbatch script of one attempt."""
    exports = _exports(spec, cpus_per_task(spec, config))
    port = rendezvous_port(spec.job_id, spec.attempt)
    torchrun = [
        *torchrun_prefix(),
        "--nnodes",
        "$SLURM_NNODES",
        "--nproc_per_node",
        str(spec.nproc_per_node),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"$head_node:{port}",
        "--rdzv_id",
        f"{spec.job_id}-{spec.attempt}",
        "--max-restarts",
        "0",
        "-m",
        spec.trainer_module,
        "--recipe",
        str(spec.recipe_path),
        "--run-dir",
        str(run_dir),
    ]
    quoted = [a if a.startswith("$") else shlex.quote(a) for a in torchrun]
    quoted = [f'"{a}"' if a.startswith("$") else a for a in quoted]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# tuneyard job {spec.job_id}, attempt {spec.attempt}: written by the SLURM executor",
            *sbatch_directives(spec, config, run_dir),
            "set -euo pipefail",
            *(f"export {key}={shlex.quote(value)}" for key, value in sorted(exports.items())),
            "export SLURM_EXPORT_ENV=ALL  # srun passes this script's environment to torchrun",
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 " + " ".join(quoted),
            "",
        ]
    )


class FollowedFile:
    """A growing output file read line by line, ending when the job has ended and the
    file is read to its end (it may not exist until the job starts)."""

    def __init__(self, path: Path, ended: Callable[[], bool], poll_s: float = 0.2) -> None:
        self.path, self.ended, self.poll_s = path, ended, poll_s
        self._handle = None
        self._partial = b""

    def readline(self) -> bytes:
        while True:
            if self._handle is None and self.path.exists():
                self._handle = self.path.open("rb")
            finished = self.ended()  # read before the data: a final read follows the end
            chunk = self._handle.readline() if self._handle else b""
            self._partial += chunk
            if self._partial.endswith(b"\n") or (finished and not chunk and self._partial):
                line, self._partial = self._partial, b""
                return line
            if finished and not chunk:
                return b""
            time.sleep(self.poll_s)

    def close(self) -> None:
        if self._handle:
            self._handle.close()

    def __enter__(self) -> FollowedFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def parse_job_record(text: str) -> dict[str, str]:
    """`Key=Value` pairs of one `scontrol show job -o` line."""
    return dict(re.findall(r"(\w+)=(\S*)", text))


class SlurmAttempt:
    def __init__(self, spec: LaunchSpec, config: WorkerConfig, run_dir: Path, slurm_id: str):
        self.spec, self.config, self.slurm_id = spec, config, slurm_id
        self.state, self.exit_code, self.reason = "PENDING", "0:0", ""
        self._final: str | None = None
        self._seen_running = False
        self._next_query = 0.0
        stem = run_dir / f"slurm-a{spec.attempt}"
        ended = lambda: self._final is not None  # noqa: E731
        self.stdout = FollowedFile(Path(f"{stem}.out"), ended)
        self.stderr = FollowedFile(Path(f"{stem}.err"), ended)

    @classmethod
    def submit(cls, spec: LaunchSpec, run_dir: Path, config: WorkerConfig) -> SlurmAttempt:
        script = run_dir / f"slurm-a{spec.attempt}.sbatch"
        script.write_text(batch_script(spec, config, run_dir))
        try:
            done = _run(["sbatch", "--parsable", str(script)])
        except subprocess.TimeoutExpired as exc:
            raise LaunchUnavailable(f"sbatch did not answer in {COMMAND_TIMEOUT_S:.0f}s") from exc
        except (subprocess.SubprocessError, FileNotFoundError) as exc:
            raise OSError(f"sbatch could not run: {exc}") from exc
        if done.returncode != 0 or not done.stdout.strip():
            said = done.stderr.strip() or done.stdout.strip()
            if CONTROLLER_UNAVAILABLE.search(said):
                raise LaunchUnavailable(f"the SLURM controller is unavailable: {said}")
            raise OSError(f"sbatch refused the job: {said}")
        return cls(spec, config, run_dir, done.stdout.strip().split(";")[0])

    # ---- following --------------------------------------------------------------------
    def _query(self) -> None:
        done = _run(["scontrol", "show", "job", "-o", self.slurm_id])
        record = parse_job_record(done.stdout) if done.returncode == 0 else {}
        if not record:
            record = self._from_accounting()
        if not record:  # forgotten by both: it ended long ago or was purged
            self.state, self.reason = "LOST", "SLURM no longer knows the job"
            return
        self.state = record.get("JobState") or record.get("State", "UNKNOWN").split()[0]
        self.exit_code = record.get("ExitCode", self.exit_code)
        self.reason = record.get("Reason", "")

    def _from_accounting(self) -> dict[str, str]:
        try:
            done = _run(["sacct", "-n", "-P", "-X", "-j", self.slurm_id, "-o", "State,ExitCode"])
        except (subprocess.SubprocessError, FileNotFoundError):
            return {}
        fields = done.stdout.strip().splitlines()[0].split("|") if done.stdout.strip() else []
        return {"State": fields[0], "ExitCode": fields[1]} if len(fields) == 2 else {}

    def poll(self) -> int | None:
        if self._final is not None:
            return self.returncode()
        if time.monotonic() >= self._next_query:
            self._next_query = time.monotonic() + self.config.slurm_poll_seconds
            try:
                self._query()
            except subprocess.SubprocessError:
                return None  # slurmctld busy or restarting: ask again next time
            self._seen_running |= self.state in ("RUNNING", "COMPLETING")
            if self.state not in ACTIVE_STATES:
                self._final = self.state
                return self.returncode()
        return None

    def started(self) -> bool:
        self.poll()
        return self._seen_running or self._final is not None

    def describe(self) -> dict[str, str]:
        return {
            "slurm_job_id": self.slurm_id,
            "executor": "slurm",
            "command": f"sbatch slurm-a{self.spec.attempt}.sbatch",
        }

    def returncode(self) -> int:
        code, _, sig = self.exit_code.partition(":")
        if self._final in ("TIMEOUT", "PREEMPTED"):
            return int(ExitCode.PREEMPTED)
        if self._final == "CANCELLED":
            return -int(signal.SIGTERM)
        if sig.isdigit() and int(sig):
            return -int(sig)
        return int(code) if code.isdigit() else int(ExitCode.CRASH)

    def outcome(self) -> Outcome | None:
        """Ends an exit code does not tell apart from a crash (None: classify by exit)."""
        reason = f"SLURM job {self.slurm_id} ended {self._final}" + (
            f" ({self.reason})" if self.reason and self.reason != "None" else ""
        )
        if self._final in ("NODE_FAIL", "BOOT_FAIL", "LOST"):
            return Outcome(Verdict.RETRY, "node_fail", reason, self.returncode())
        if self._final == "OUT_OF_MEMORY":
            return Outcome(
                Verdict.FAILED,
                "out_of_memory",
                reason + ": host memory exceeded",
                int(ExitCode.OUT_OF_MEMORY),
            )
        if self._final == "DEADLINE":
            return Outcome(Verdict.FAILED, "slurm_deadline", reason, self.returncode())
        return None

    # ---- stopping ---------------------------------------------------------------------
    def signal_stop(self, sig: signal.Signals) -> None:
        """SIGTERM: `scancel`, which sends every step SIGTERM (the trainer checkpoints) and
        SIGKILL after the cluster's KillWait, and ends the job CANCELLED; SIGKILL (the
        grace period is over): kill whatever is left of it at once."""
        if self._final is not None:
            return
        if sig == signal.SIGTERM:
            _run(["scancel", self.slurm_id])
        else:
            _run(["scancel", "--signal=KILL", "--full", self.slurm_id])

    def cleanup(self) -> None:
        if self._final is None:
            _run(["scancel", self.slurm_id])


def cancel_older_attempts(job_id: str, attempt: int) -> list[str]:
    """Cancel SLURM jobs of this job's earlier attempts (a taken-over lease leaves them)."""
    try:
        listed = _run(["squeue", "-h", "-o", "%i|%j"])
    except (subprocess.SubprocessError, FileNotFoundError):
        return []
    prefix, cancelled = f"ty-{job_id}-a", []
    for line in listed.stdout.splitlines():
        slurm_id, _, name = line.partition("|")
        older = name.startswith(prefix) and name[len(prefix) :].isdigit()
        if older and int(name[len(prefix) :]) < attempt:
            _run(["scancel", slurm_id.strip()])
            cancelled.append(slurm_id.strip())
    return cancelled
