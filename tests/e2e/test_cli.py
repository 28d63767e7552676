"""The `tuneyard` client commands against a real API on PostgreSQL.

The job's lifecycle is driven with the state machine's own transition function (what the
worker calls), so each exit code is checked for a job that really succeeded, failed or was
cancelled in the database; metrics and logs go in through the worker's ingest functions.
Every command runs as a subprocess with pipes: no TTY, as in CI.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(stack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*stack.cli_argv, *args], env=stack.env, cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def start_cli(stack, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*stack.cli_argv, *args], env=stack.env, cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


@pytest.fixture(scope="module")
def recipe_file(tmp_path_factory, valid_recipe) -> Path:
    path = tmp_path_factory.mktemp("recipes") / "tiny.yaml"
    path.write_text(valid_recipe)
    return path


def newest_job(stack, name: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    with stack.client() as client:
        while time.monotonic() < deadline:
            for job in client.get("/v1/jobs", params={"limit": 50}).json()["data"]:
                if job["name"] == name:
                    return job
            time.sleep(0.2)
    raise AssertionError(f"no job named {name}")


def submit_job(stack, recipe_file: Path, name: str) -> str:
    result = run_cli(stack, "submit", str(recipe_file), "--name", name, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["id"]


def test_submit_wait_exits_0_when_the_job_succeeds(stack, recipe_file):
    proc = start_cli(stack, "submit", str(recipe_file), "--name", "ok-job", "--wait")
    job = newest_job(stack, "ok-job")
    stack.drive(job["id"], "starting", "running", "succeeded")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"job {job['id']} succeeded" in out


def test_submit_wait_exits_1_with_the_reason_when_the_job_fails(stack, recipe_file):
    proc = start_cli(stack, "submit", str(recipe_file), "--name", "bad-job", "--wait")
    job = newest_job(stack, "bad-job")
    stack.drive(job["id"], "starting", "running", "failed", error_code="nan_loss",
                error_message="loss became NaN at step 7")  # fmt: skip
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "failed (nan_loss): loss became NaN at step 7" in err


def test_wait_exits_3_for_a_cancelled_job(stack, recipe_file):
    job_id = submit_job(stack, recipe_file, "cancel-me")
    cancel = run_cli(stack, "cancel", job_id)
    assert cancel.returncode == 0, cancel.stderr
    result = run_cli(stack, "wait", job_id)
    assert result.returncode == 3
    assert f"job {job_id} cancelled" in result.stderr


def test_wait_times_out_with_exit_4(stack, recipe_file):
    job_id = submit_job(stack, recipe_file, "slow-job")
    result = run_cli(stack, "wait", job_id, "--timeout", "1", "--poll", "0.2")
    assert result.returncode == 4
    assert "still queued" in result.stderr


def test_watch_renders_progress_without_a_tty(stack, recipe_file):
    from jobs.store.engine import session_scope
    from jobs.store.ingest import upsert_metrics

    job_id = submit_job(stack, recipe_file, "watched")
    stack.drive(job_id, "starting", "running")
    watch = start_cli(stack, "watch", job_id, "--poll", "0.3")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(watch.stdout), daemon=True)
    reader.start()
    for step in range(1, 21):
        record = {"kind": "train", "step": step, "loss": 3.0 - step * 0.1, "tps": 1500.0,
                  "lr": 1e-3, "timestamp": time.time()}  # fmt: skip
        with session_scope(stack.settings) as session:
            upsert_metrics(session, job_id, 1, [record])
        time.sleep(0.05)
    # The job ends only once the watch has shown step 20 (a loaded machine may start the
    # CLI after the metrics are written): what is tested is the line, not the start-up.
    deadline = time.monotonic() + 60
    while not any("step 20/40" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    stack.drive(job_id, "succeeded")
    watch.wait(timeout=60)
    reader.join(timeout=10)
    out, err = "".join(lines), watch.stderr.read()
    assert watch.returncode == 0, err
    assert "\x1b[" not in out  # no cursor movement or colour codes on a pipe
    assert "running  step 20/40  loss 1.0000  tps 1500" in out
    assert f"job {job_id} succeeded" in out


def test_invalid_recipe_is_refused_with_exit_2_and_the_field(stack, tmp_path, valid_recipe):
    bad = tmp_path / "bad.yaml"
    bad.write_text(valid_recipe.replace("lr: 1.0e-3", "lr: 1.0e-3, lrr: 2"))
    result = run_cli(stack, "submit", str(bad))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "error: the server refused the request (1 problem):"
    assert lines[1].startswith("  optimizer.lrr: ") and "fix: " in lines[1]
    assert "{" not in result.stderr


def test_override_tokens_reach_the_server(stack, recipe_file):
    result = run_cli(stack, "submit", str(recipe_file), "--name", "overridden", "--json",
                     "--step_scheduler.max_steps", "7", "optimizer.lr=5e-4")  # fmt: skip
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["max_steps"] == 7
    assert job["recipe"]["optimizer"]["lr"] == 5e-4
    assert job["overrides"] == ["step_scheduler.max_steps=7", "optimizer.lr=5e-4"]


def test_a_bare_flag_override_means_true_as_in_validate(stack, tmp_path, valid_recipe):
    recipe = tmp_path / "no_ckpt.yaml"
    recipe.write_text(valid_recipe + "checkpoint: {enabled: false}\n")
    result = run_cli(stack, "submit", str(recipe), "--json", "--checkpoint.enabled",
                     "--step_scheduler.max_steps=9", "--name", "flagged", "--rng.seed", "5",
                     "--checkpoint.save_optimizer")  # fmt: skip
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["name"] == "flagged"
    assert job["recipe"]["checkpoint"]["enabled"] is True
    assert job["recipe"]["checkpoint"]["save_optimizer"] is True
    assert job["recipe"]["rng"]["seed"] == 5 and job["max_steps"] == 9
    assert job["overrides"] == ["checkpoint.enabled=true", "step_scheduler.max_steps=9",
                                "rng.seed=5", "checkpoint.save_optimizer=true"]  # fmt: skip


def test_cancelling_a_finished_job_prints_the_message_and_its_state(stack, recipe_file):
    job_id = submit_job(stack, recipe_file, "done-job")
    stack.drive(job_id, "starting", "running", "succeeded")
    result = run_cli(stack, "cancel", job_id)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "error: cannot cancel a succeeded job"  # the API's message, not JSON
    assert "  current state: succeeded" in lines
    assert "{" not in result.stderr and "illegal_transition" not in result.stderr


def test_read_commands_print_json(stack, recipe_file):
    job_id = submit_job(stack, recipe_file, "json-job")
    listed = run_cli(stack, "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert job_id in [job["id"] for job in json.loads(listed.stdout)]
    shown = run_cli(stack, "status", job_id, "--json")
    assert json.loads(shown.stdout)["status"] == "queued"
    plain = run_cli(stack, "status", job_id)
    assert "state     queued" in plain.stdout


def test_logs_prints_the_job_log(stack, recipe_file):
    from jobs.store.engine import session_scope
    from jobs.store.ingest import append_logs

    job_id = submit_job(stack, recipe_file, "logged")
    with session_scope(stack.settings) as session:
        append_logs(session, job_id, 1, [("stdout", i, f"line {i}") for i in range(3)])
    result = run_cli(stack, "logs", job_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["line 0", "line 1", "line 2"]


def test_logs_pages_with_next_cursor_through_a_long_log(stack, recipe_file):
    """Over several pages (`has_more`, `next_cursor`): every line once, in order."""
    from jobs.store.engine import session_scope
    from jobs.store.ingest import append_logs

    job_id = submit_job(stack, recipe_file, "long-log")
    with session_scope(stack.settings) as session:
        append_logs(session, job_id, 1, [("stdout", i, f"line {i}") for i in range(1234)])
    result = run_cli(stack, "logs", job_id, "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line)["text"] for line in result.stdout.splitlines()]
    assert lines == [f"line {i}" for i in range(1234)]


def test_unknown_job_and_bad_key_exit_2_with_the_servers_message(stack):
    missing = run_cli(stack, "status", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: job 00000000-0000-0000-0000-000000000000 not found")
    env_key = run_cli(stack, "jobs", "--api-key", "ty_wrong")
    assert env_key.returncode == 2
    assert env_key.stderr.startswith("error: unknown or revoked API key; set TUNEYARD_API_KEY")


def test_unreachable_server_exits_6(stack):
    result = run_cli(stack, "jobs", "--server", "http://127.0.0.1:9")
    assert result.returncode == 6
    assert "cannot reach" in result.stderr


def test_pause_makes_wait_exit_5_and_resume_requeues(stack, recipe_file):
    job_id = submit_job(stack, recipe_file, "pause-me")
    paused = run_cli(stack, "pause", job_id, "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["status"] == "paused"
    waited = run_cli(stack, "wait", job_id)
    assert waited.returncode == 5
    assert f"resume it with `tuneyard resume {job_id}`" in waited.stderr
    resumed = run_cli(stack, "resume", job_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "now queued" in resumed.stdout


def test_a_bad_override_exits_2_before_any_request(tmp_path, recipe_file, tuneyard):
    env = {"TUNEYARD_URL": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([*tuneyard, "submit", str(recipe_file), "optimizer.lr"],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2
    assert "error: invalid overrides:" in result.stderr
    assert "overrides: 'optimizer.lr' is not an override" in result.stderr
    assert "fix: write --section.key value" in result.stderr
    assert "cannot reach" not in result.stderr
