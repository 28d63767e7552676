"""The recipe contract: from YAML or JSON to a checked recipe, a topology and a plan.

`validation.validate_job` is the one entry point; it runs the stages in order, each a
sub-package: `load/` (text, bounds, overrides, the schema, normalisation), `automodel/`
(AutoModel's spellings translated), `targets/` (the `_target_` allowlist), `topology/`
(DistributedSetup and its rules), `model/` (config and capabilities), `paths/` (roots and
the project's scope), `sections/` (rules of single sections) and `plan/` (batches, FLOPs,
estimate, memory fit). `typed.Recipe` is what the trainer reads. Also at the top: `errors`,
`settings`, and the shared lists the trainer and the services agree on, `exit_codes` and
`metrics_sample`.

May import: the standard library, pydantic, pydantic_settings, yaml, and the torch-free
`models.registry` table. Never torch, never the database.
"""
