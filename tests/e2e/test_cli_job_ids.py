"""The `tuneyard` client commands' shared behaviour against a real API on PostgreSQL: job id
prefixes, `--json` refusals on stdout, the global `--server` / `--api-key`, `status`'s plan
and metrics, and `submit --wait`'s progress and summary.

Jobs with chosen ids are written straight into the database, so prefixes are unique or
shared on purpose; another project's jobs share prefixes with this project's to show they
are never found and never make a prefix ambiguous. Every command runs as a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIQUE = "aaaa1111-0000-4000-8000-000000000001"
SHARED = ("bbbb2222-0000-4000-8000-000000000001", "bbbb2222-0000-4000-8000-000000000002")
# The other project's: one with this project's unique prefix, one with a prefix all its own.
OTHERS = ("aaaa1111-9999-4000-8000-000000000009", "cccc3333-0000-4000-8000-000000000003")
NOWHERE = "dddd4444"
PLAN = {"architecture": "LlamaForCausalLM", "param_count": 1_234_567, "world_size": 2,
        "nnodes": 1, "nproc_per_node": 2, "accelerator": "cpu", "strategy": "fsdp2",
        "dp_size": 2, "tp_size": 1, "global_batch_size": 8, "local_batch_size": 2,
        "grad_accumulation_steps": 2, "max_steps": 40, "seq_length": 64,
        "tokens_per_step": 512}  # fmt: skip


def run_cli(stack, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*stack.cli_argv, *args], env=env or stack.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def env_without_server(stack) -> dict[str, str]:
    return {k: v for k, v in stack.env.items() if k not in ("TUNEYARD_URL", "TUNEYARD_API_KEY")}


@pytest.fixture(scope="module")
def jobs(stack) -> dict[str, str]:
    """This project's and another project's jobs at chosen ids; the other project's key."""
    from jobs.store.api_keys import create_api_key, verify_key
    from jobs.store.engine import session_scope
    from jobs.store.tables import Job

    with session_scope(stack.settings) as session:
        mine = verify_key(session, stack.api_key).project_id
        other_key = create_api_key(session, "e2e-other", "admin")[1]
        theirs = verify_key(session, other_key).project_id
        for job_id, project in [*((j, mine) for j in (UNIQUE, *SHARED)),
                                *((j, theirs) for j in OTHERS)]:  # fmt: skip
            session.add(Job(id=job_id, project_id=project, name=f"job-{job_id[:4]}",
                            status="queued", spec={}, recipe={}, plan=PLAN, resources={},
                            labels={}))  # fmt: skip
    return {"other_key": other_key}


def test_a_unique_prefix_names_the_job_even_when_another_project_shares_it(stack, jobs):
    result = run_cli(stack, "status", UNIQUE[:8], "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["id"] == UNIQUE
    cancelled = run_cli(stack, "cancel", UNIQUE[:13].upper())
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelling job {UNIQUE}: now cancelled" in cancelled.stdout


def test_an_ambiguous_prefix_is_refused_with_every_candidate(stack, jobs):
    result = run_cli(stack, "status", SHARED[0][:8])
    assert result.returncode == 2, result.stderr
    assert "matches 2 jobs" in result.stderr
    assert all(job_id in result.stderr for job_id in SHARED)
    as_json = run_cli(stack, "status", SHARED[0][:8], "--json")
    error = json.loads(as_json.stdout)["error"]
    assert (error["code"], error["http_status"], error["exit_code"]) == ("ambiguous_job_id", 409, 2)
    assert error["candidates"] == list(SHARED)


def test_a_prefix_shorter_than_8_characters_is_refused_with_the_fix(stack, jobs):
    result = run_cli(stack, "status", UNIQUE[:6])
    assert result.returncode == 2
    assert "job_id: 'aaaa11' is too short to name a job" in result.stderr
    assert "at least its first 8 characters" in result.stderr


def test_another_projects_job_is_not_found_exactly_like_no_job(stack, jobs):
    theirs = run_cli(stack, "status", OTHERS[1][:8], "--json")
    nowhere = run_cli(stack, "status", NOWHERE, "--json")
    assert theirs.returncode == nowhere.returncode == 2
    assert json.loads(theirs.stdout.replace(OTHERS[1][:8], NOWHERE)) == json.loads(nowhere.stdout)
    assert json.loads(nowhere.stdout)["error"]["code"] == "not_found"
    # Its own project finds it, through the global --api-key.
    found = run_cli(stack, "--api-key", jobs["other_key"], "status", OTHERS[1][:8], "--json")
    assert found.returncode == 0 and json.loads(found.stdout)["id"] == OTHERS[1]


def test_json_errors_are_one_document_on_stdout(stack, jobs):
    result = run_cli(stack, "logs", NOWHERE, "--json")
    assert result.returncode == 2 and result.stderr == ""
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "not_found" and error["http_status"] == 404
    assert error["message"] == f"job {NOWHERE} not found"
    unreachable = run_cli(stack, "--server", "http://127.0.0.1:9", "jobs", "--json")
    assert unreachable.returncode == 6 and unreachable.stderr == ""
    assert json.loads(unreachable.stdout)["error"]["code"] == "unreachable"
    bad_key = run_cli(stack, "jobs", "--api-key", "nope", "--json")
    assert json.loads(bad_key.stdout)["error"]["http_status"] == 401


def test_global_server_and_api_key_options(stack, jobs):
    env = env_without_server(stack)
    given = ["--server", stack.url, "--api-key", stack.api_key]
    result = run_cli(stack, *given, "status", UNIQUE[:8], "--json", env=env)
    assert result.returncode == 0, result.stderr
    # The global option wins over the environment; a command's own option over both.
    env_dead = {**stack.env, "TUNEYARD_URL": "http://127.0.0.1:9"}
    assert run_cli(stack, "--server", stack.url, "jobs", env=env_dead).returncode == 0
    own = run_cli(stack, "--server", "http://127.0.0.1:9", "jobs", "--server", stack.url)
    assert own.returncode == 0, own.stderr


def test_status_shows_the_plans_key_numbers_and_the_last_metrics(stack, jobs):
    from jobs.store.engine import session_scope
    from jobs.store.ingest import upsert_metrics

    record = {"kind": "train", "step": 12, "loss": 1.25, "lr": 5e-4, "tps": 900.0,
              "grad_norm": 0.75, "timestamp": time.time()}  # fmt: skip
    with session_scope(stack.settings) as session:
        upsert_metrics(session, SHARED[1], 1, [record])
    out = run_cli(stack, "status", SHARED[1]).stdout
    for line in ("progress  12/40", "model        LlamaForCausalLM", "parameters   1,234,567",
                 "ranks        2 = 1 node(s) x 2 cpu", "parallelism  fsdp2 dp=2 tp=1",
                 "batch        global 8 = local 2 x accumulation 2 x dp 2",
                 "max steps    40", "tokens/step  512", "last step  12", "loss       1.2500",
                 "lr         0.0005", "tps        900"):  # fmt: skip
        assert line in out, out


def test_submit_wait_shows_progress_and_a_summary(stack, jobs, tmp_path, valid_recipe):
    from jobs.store.engine import session_scope
    from jobs.store.ingest import upsert_checkpoints, upsert_metrics

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(valid_recipe)
    argv = [*stack.cli_argv, "submit", str(recipe), "--name", "summarised", "--wait"]
    proc = subprocess.Popen(argv, env=stack.env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    job_id = wait_for_job(stack, "summarised")
    stack.drive(job_id, "starting", "running")
    with session_scope(stack.settings) as session:
        for step in range(1, 21):
            record = {"kind": "train", "step": step, "loss": 3.0 - step * 0.1, "tps": 1500.0,
                      "timestamp": time.time()}  # fmt: skip
            upsert_metrics(session, job_id, 1, [record])
        event = {"event": "checkpoint_saved", "step": 20, "path": "/ckpt/step_20"}
        upsert_checkpoints(session, job_id, 1, [event])
    time.sleep(1.5)
    stack.drive(job_id, "succeeded")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "running  step 20/40  loss 1.0000  tps 1500" in out  # the same line as `watch`
    tail = out[out.index(f"job {job_id} succeeded") :].splitlines()
    assert tail[1:] == ["  state       succeeded", "  steps       20/40",
                        "  final loss  1.0000", "  checkpoint  /ckpt/step_20 (step 20)"]  # fmt: skip


def wait_for_job(stack, name: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    with stack.client() as client:
        while time.monotonic() < deadline:
            for job in client.get("/v1/jobs", params={"limit": 50}).json()["data"]:
                if job["name"] == name:
                    return job["id"]
            time.sleep(0.2)
    raise AssertionError(f"no job named {name}")


def test_submit_wait_timeout_is_exit_4_with_the_error_as_json(stack, jobs, tmp_path, valid_recipe):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(valid_recipe)
    result = run_cli(stack, "submit", str(recipe), "--wait", "--timeout", "1", "--json")
    assert result.returncode == 4, result.stderr
    assert json.loads(result.stdout)["error"]["code"] == "timed_out"
