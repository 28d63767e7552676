"""tuneyard's core, torch-free, in three rooms and a module.

- `jobs.recipe`: the contract. Recipe schema, loading, overrides, `_target_` table, allowed
  roots, DistributedSetup and its rules, model capabilities, batch arithmetic, the plan,
  `validate_job`, exit codes and the MetricsSample fields. Standard library, pydantic and
  yaml only; the trainer imports this room and no other.
- `jobs.store`: persistence. Tables, engine and sessions, queries, ingestion, leases, API
  keys, the status values and the services' settings. May import `jobs.recipe`.
- `jobs.orchestration`: job states. The (from, to) rule table, the one locked `transition`,
  claims, and `policy`: how an outcome settles, what retries, what an expired lease becomes.
  May import `jobs.store`.
- `jobs.broker`: the only module that knows Celery, kombu or Redis.

tests/unit/test_import_rules.py enforces these allow-lists.
"""
