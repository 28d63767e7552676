"""Exports run by the real worker on PostgreSQL and Redis: a tiny Llama LoRA job trains a few
steps; a merged export of its checkpoint (requested with `tuneyard export --wait` from a
served API, sharded small so the index is written) loads in `transformers` with the logits
of peft's base-plus-adapter model; a running export is cancelled; an adapter-only export of the same checkpoint whose worker
died mid-way is re-queued by the reconciler and finished on a second attempt (one trained
job serves all four: training is most of the time). The worker runs with the artifact store
(SeaweedFS): a succeeded export is in the bucket, with every file its manifest lists; once
the checkpoint's local copy is evicted, an export of it is fetched from the store."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_harness import insert_job, job_row, wait_for

pytestmark = pytest.mark.slow


def lora_recipe(assets: dict[str, Path], max_steps: int) -> dict[str, Any]:
    from jobs.recipe.validation import validate_job

    def dataset(path: Path) -> dict[str, Any]:
        return {"_target_": "tuneyard.datasets.JsonlInstructionDataset", "path": str(path),
                "tokenizer_name_or_path": str(assets["model"]), "max_seq_length": 32}  # fmt: skip

    recipe = {
        "step_scheduler": {"max_steps": max_steps, "global_batch_size": 4, "local_batch_size": 4,
                           "val_check_interval": max_steps, "checkpoint_interval": max_steps},
        "rng": {"seed": 0},
        "model": {"_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
                  "pretrained_model_name_or_path": str(assets["model"]), "dtype": "float32"},
        "peft": {"match_all_linear": True, "dim": 4, "alpha": 8},
        "dataset": dataset(assets["train"]),
        "validation_dataset": dataset(assets["val"]),
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.0},
        "checkpoint": {"enabled": True},
    }  # fmt: skip
    resources = {"nnodes": 1, "nproc_per_node": 1, "accelerator": "cpu"}
    result = validate_job(recipe, resources=resources)
    assert result.valid, result.errors
    return result.recipe


def export_row(export_id: str) -> Any:
    from jobs.store.engine import session_factory
    from jobs.store.tables import Export

    with session_factory()() as session:
        return session.get(Export, export_id)


def settled(export_id: str) -> Any:
    row = export_row(export_id)
    return row if row.status in ("succeeded", "failed", "cancelled") else None


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port in a thread; its URL."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 30, "the API to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def logits_of(model: Any, input_ids: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=input_ids).logits


def test_merged_export_logits_cancel_and_retry_through_the_worker(
    project_id, procs, tiny_assets, store_env, s3_server
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from api.main import create_app

    job_id = insert_job(project_id, lora_recipe(tiny_assets, 4))
    procs.worker("w1", trainer=None, TUNEYARD_EXPORT_MAX_SHARD_BYTES="60000")
    done = ("succeeded", "failed")
    job = wait_for(lambda: (r := job_row(job_id)).status in done and r, 120, "the job", procs)
    assert job.status == "succeeded", (job.error_message, procs.logs())
    with served(create_app()) as url:  # `tuneyard export --wait` over real HTTP
        cli = [sys.executable, "-m", "cli.main", "--server", url, "export", job_id[:8]]
        args = [*cli, "--wait", "--json", "--timeout", "120"]
        ran = subprocess.run(
            args, capture_output=True, text=True, timeout=180, env=dict(os.environ)
        )
    assert ran.returncode == 0, (ran.stdout, ran.stderr, procs.logs())
    public = json.loads(ran.stdout)
    assert (public["kind"], public["step"], public["status"]) == ("merged", 4, "succeeded")
    row = export_row(public["id"])
    assert public["path"] == f"exports/{row.id}" and public["size_bytes"] > 0
    out = Path(row.path)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    assert not (out / "adapter_config.json").exists()
    assert_stored(s3_server, row, out)

    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_assets["model"], dtype=torch.float32)
    adapter_dir = Path(job.run_dir) / "checkpoints" / "step_4" / "model"
    reference = PeftModel.from_pretrained(base, adapter_dir).eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, merged.config.vocab_size, (2, 12), generator=generator)
    expected = logits_of(reference, input_ids)
    torch.testing.assert_close(logits_of(merged, input_ids), expected, atol=1e-5, rtol=0)
    with reference.disable_adapter():  # the adapter changed something: the test can fail
        assert not torch.allclose(logits_of(reference, input_ids), expected, atol=1e-4)
    assert_a_running_export_is_cancelled(procs, job)
    assert_a_lost_workers_export_is_retried(procs, job_id)
    assert_an_evicted_checkpoint_is_fetched_for_its_export(procs, job)


def assert_stored(s3_server: Any, row: Any, out: Path) -> None:
    """The export's files are in the bucket, byte for byte, under its artifact row's key."""
    from sqlalchemy import select

    from jobs.store.engine import session_factory
    from jobs.store.tables import Artifact

    with session_factory()() as session:
        stored = session.scalars(
            select(Artifact).where(Artifact.job_id == row.job_id, Artifact.kind == "export")
        ).one()
    assert stored.name == row.id
    bucket, _, key = stored.key.removeprefix("s3://").partition("/")
    files = {entry["path"] for entry in stored.files["files"]}
    assert files == {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    first = sorted(files)[0]
    body = s3_server.client().get_object(Bucket=bucket, Key=f"{key}/{first}")["Body"].read()
    assert body == (out / first).read_bytes()


def assert_a_running_export_is_cancelled(procs, job: Any) -> None:
    """A cancel reaches the running export through its lease: the subprocess is stopped,
    the export ends `cancelled` and leaves no staging directory."""
    from fastapi.testclient import TestClient

    from api.main import create_app

    with TestClient(create_app()) as client:
        export_id = client.post(f"/v1/jobs/{job.id}/exports", json={}).json()["id"]
        started = lambda: export_row(export_id).status == "running"  # noqa: E731
        wait_for(started, 60, "the export to start", procs, every=0.05)
        answer = client.post(f"/v1/exports/{export_id}/cancel")
        assert answer.json()["status"] == "cancelling", answer.text
    row = wait_for(lambda: settled(export_id), 60, "the export to stop", procs)
    assert row.status == "cancelled", (row.error_message, procs.logs())
    assert not list((Path(job.run_dir) / "exports").glob(".staging_*"))


def assert_a_lost_workers_export_is_retried(procs, job_id: str) -> None:
    """An adapter-only export claimed by a worker that then died (its lease ran out) is
    re-queued by the reconciler and finished by the live worker, as attempt 2."""
    from jobs.orchestration.export_states import claim_export
    from jobs.store.engine import session_scope
    from jobs.store.exports import create_export
    from jobs.store.tables import Job

    with session_scope() as session:
        export = create_export(session, session.get(Job, job_id), 4, "adapter", False, "bfloat16")
        export_id = export.id
        assert claim_export(session, export_id, "w-dead", lease_seconds=-1) == 1
    procs.scheduler()
    row = wait_for(lambda: settled(export_id), 90, "the re-queued export", procs)
    assert (row.status, row.attempt) == ("succeeded", 2), (row.error_message, procs.logs())
    out = Path(row.path)
    assert json.loads((out / "export.json").read_text())["dtype"] == "bfloat16"
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()


def assert_an_evicted_checkpoint_is_fetched_for_its_export(procs, job: Any) -> None:
    """With the local copy of step 4 evicted by the retention pass (the job is finished and
    the checkpoint stored), an export downloads it from the store, succeeds and leaves no
    downloaded copy behind."""
    from fastapi.testclient import TestClient

    from api.main import create_app
    from worker.config import WorkerConfig
    from worker.retention import apply_retention_once

    step_4 = Path(job.run_dir) / "checkpoints" / "step_4"
    report = apply_retention_once(config=WorkerConfig(checkpoint_cache_hours=0))
    assert (job.id, 4) in report.evicted, report
    assert step_4.is_dir() and not any(step_4.iterdir())
    with TestClient(create_app()) as client:
        body = {"step": 4, "merge_lora": False, "dtype": "bfloat16"}
        export_id = client.post(f"/v1/jobs/{job.id}/exports", json=body).json()["id"]
    row = wait_for(lambda: settled(export_id), 90, "the evicted checkpoint's export", procs)
    assert row.status == "succeeded", (row.error_message, procs.logs())
    assert (Path(row.path) / "adapter_model.safetensors").is_file()
    assert not list((Path(job.run_dir) / "exports").glob(".source_*"))
    assert not any(step_4.iterdir())  # still evicted: the download was the export's own
