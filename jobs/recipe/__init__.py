"""The recipe contract: from YAML or JSON to a checked recipe, a topology and a plan.

Owns the recipe schema (`schema`), loading (`yaml_loader`), overrides (`overrides`), the
`_target_` allowlist (`target_table`, `targets`), allowed filesystem roots (`paths`,
`settings`), the DistributedSetup and its rules (`distributed*`), model capabilities read
from configs (`model_config`), cross-field rules (`checks`), normalisation (`normalize`),
the plan (`plan`) and the one entry point, `validation.validate_job`. Also the shared lists
the trainer and the services agree on: `exit_codes` and `metrics_sample`.

May import: the standard library, pydantic, pydantic_settings, yaml, and the torch-free
`models.registry` table. Never torch, never the database.
"""
