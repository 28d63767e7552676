"""The worker: runs queued jobs under torchrun and reports everything back to the database.

Contract (the rest of tuneyard relies on these, and only these):
- A broker message is `tuneyard.run_job(job_id)` on a queue named for a resource class
  (`cpu`, `gpu-1`, `gpu-8`); `jobs.broker.enqueue_job` sends it. The message is a hint:
  `jobs.orchestration.claims.claim_job` decides in the database who runs an attempt, and the attempt
  number fences every later write (`worker.supervisor`, `worker.settle`).
- Per attempt the worker writes `<runs_dir>/<job>/recipe.json`, starts
  `torchrun ... -m trainer --recipe ... --run-dir ...` (`worker.launcher`), ingests
  `metrics.jsonl`, `events.jsonl` and stdout/stderr within a second (`jobs.store.ingest`), obeys
  `cancelling` / `pausing` within the poll interval, and reports the attempt's outcome;
  `jobs.orchestration.policy` decides the status it leads to (cancel wins, pause after
  finish, the retry budget) and which exit codes and trainer events mean what.
- `tuneyard scheduler` (`worker.reconciler`) takes over expired leases, re-sends queued
  jobs the broker lost, and marks silent workers lost. Multi-node gangs: `worker.gang`.
- The worker never imports `trainer`, `models` or torch: training is a subprocess.
"""
