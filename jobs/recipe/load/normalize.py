"""From a raw recipe dict to the normalized recipe the trainer reads, with every error.

`normalize_recipe` runs the section checks in a fixed order (names and synonyms, fixed
sections, `_target_` sections, topology, paths, model capabilities, batches, bounds) and
collects all errors instead of stopping at the first. The normalized recipe has every
canonical key filled: resolved batch sizes and dp, the canonical strategy name,
`restore_from` as null or `{"path": ...}`, defaults of the fixed sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.recipe.automodel.blocks import fold_automodel_blocks
from jobs.recipe.automodel.forms import check_warmup_decay, fold_value_forms
from jobs.recipe.automodel.inert import fold_inert_keys
from jobs.recipe.automodel.refused import refused_features
from jobs.recipe.automodel.sections import fold_side_sections
from jobs.recipe.errors import FieldError
from jobs.recipe.load.schema import (
    FIXED_SECTIONS,
    REQUIRED_TARGET_SECTIONS,
    TARGET_SECTIONS,
    TOP_LEVEL_KEYS,
    check_fixed_section,
    check_recipe_name,
    fold_synonyms,
    normalize_restore_from,
    unknown_top_level,
)
from jobs.recipe.model.config import (
    architecture_of,
    capability_errors,
    check_model_kwargs,
    context_parallel_config_errors,
    estimate_param_count,
    expert_parallel_config_errors,
    hub_cache_root,
    read_config_file,
    tensor_parallel_config_errors,
)
from jobs.recipe.model.fused_layout import fused_lora_errors
from jobs.recipe.model.hub import hub_model_config, tokenizer_revisions
from jobs.recipe.model.lora_targets import expert_target_errors, lora_target_errors
from jobs.recipe.model.overrides import check_overrides, config_with_overrides
from jobs.recipe.paths.data import check_checkpoint_paths, check_data_paths
from jobs.recipe.paths.roots import PathCheck, Roots
from jobs.recipe.paths.scope import JobScope
from jobs.recipe.plan.batches import resolve_batches
from jobs.recipe.sections.benchmark import check_benchmark
from jobs.recipe.sections.chat_template import read_chat_template
from jobs.recipe.sections.embedding_row_repair import check_embedding_row_repair
from jobs.recipe.sections.kd import (
    KD_RECIPE,
    as_teacher_errors,
    check_kd_loss,
    check_kd_ratio,
    kd_topology_errors,
    prepare_kd_keys,
    vocab_errors,
)
from jobs.recipe.sections.neftune import check_neftune
from jobs.recipe.sections.quantization import check_quantization
from jobs.recipe.sections.retention import check_keep_best
from jobs.recipe.sections.tokenizer_source import tokenizer_errors
from jobs.recipe.sections.trackers import check_trackers
from jobs.recipe.sections.values import (
    check_dataset_values,
    check_lr_scheduler,
    check_moe_rank_scaling,
    check_optimizer,
    check_packing,
    check_peft,
    has_experts,
    mock_vocab_errors,
)
from jobs.recipe.settings import RecipeSettings
from jobs.recipe.targets.allowlist import (
    check_target_section,
    fold_kwarg_synonyms,
    is_target_section,
    stray_target_errors,
    target_warnings,
)
from jobs.recipe.topology.megatron_fsdp import as_fsdp2
from jobs.recipe.topology.pipeline import pipeline_config_errors
from jobs.recipe.topology.section import setup_from_section
from jobs.recipe.topology.setup import DistributedSetup
from jobs.recipe.topology.trainer_support import check_trainer_support

SECTION_KINDS = {
    "model": "model",
    "loss_fn": "loss",
    "dataset": "dataset",
    "validation_dataset": "dataset",
    "optimizer": "optimizer",
    "lr_scheduler": "lr_scheduler",
    "teacher_model": "model",
    "kd_loss_fn": "loss",
    "tokenizer": "tokenizer",
}
DEFAULT_LOSS = {"_target_": "tuneyard.loss.MaskedCrossEntropy"}
EXAMPLES = {
    "model": "model: {_target_: tuneyard.models.AutoModelForCausalLM.from_pretrained, "
    "pretrained_model_name_or_path: ...}",
    "dataset": "dataset: {_target_: tuneyard.datasets.SquadDataset, path_or_dataset: ...}",
    "optimizer": "optimizer: {_target_: torch.optim.AdamW, lr: 1.0e-5}",
}


@dataclass(frozen=True)
class ModelInfo:
    architecture: str | None = None
    param_count: int | None = None
    config: dict[str, Any] | None = None
    warnings: list[FieldError] = field(default_factory=list)
    revisions: dict[str, str] = field(default_factory=dict)  # hub name -> the commit read


def _fixed_sections(data: dict[str, Any], out: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    for name in FIXED_SECTIONS:
        section, errs = check_fixed_section(name, data.get(name))
        out[name], errors = section or {}, errors + errs
    out["peft"] = None
    if data.get("peft") is not None:
        section, errs = check_fixed_section("peft", data["peft"])
        out["peft"], peft_errs = check_peft(section)
        errors += errs + peft_errs
    out["restore_from"], errs = normalize_restore_from(data.get("restore_from"))
    return errors + errs


def _target_sections(
    data: dict[str, Any],
    out: dict[str, Any],
    settings: RecipeSettings,
    scope: JobScope | None,
    warnings: list[FieldError],
) -> list[FieldError]:
    """Each `_target_` section checked into `out`; a chat template file is read first, its
    note appended to `warnings`."""
    errors: list[FieldError] = []
    for name in TARGET_SECTIONS:
        value = data.get(name)
        out[name] = dict(value) if isinstance(value, dict) else None
        if value is None and name in REQUIRED_TARGET_SECTIONS:
            errors.append(FieldError(name, "is required", f"add {EXAMPLES[name]}"))
        elif value is None and name == "loss_fn":
            out[name] = dict(DEFAULT_LOSS)
        elif not isinstance(value, dict) and value is not None:
            fix = f"write {name}: as a YAML mapping with _target_ and its arguments"
            errors.append(FieldError(name, "must be a mapping with a _target_", fix))
        elif value is not None:
            if name in ("dataset", "validation_dataset"):
                errs, notes = read_chat_template(out[name], name, settings, scope)
                errors += errs
                warnings += notes
            errors += _target_section(name, out[name], settings)
    return errors


def _stray_targets(out: dict[str, Any]) -> list[FieldError]:
    """Only the target sections (and the slots their specs declare) may build objects."""
    errors: list[FieldError] = []
    for name, section in out.items():
        if name not in TARGET_SECTIONS:
            errors += stray_target_errors(section, name)
    return errors


def _target_section(
    name: str, section: dict[str, Any], settings: RecipeSettings
) -> list[FieldError]:
    """One `_target_` section, normalized in place: legacy keys out, synonyms folded."""
    grants = (settings.allow_remote_code, settings.allow_pickle_weights)
    errors = check_model_kwargs(section, *grants) if name == "model" else []
    if name == "teacher_model":  # the student's loader rules, reported at teacher_model
        errors = as_teacher_errors(check_model_kwargs(section, *grants))
    if name == "kd_loss_fn":
        errors += check_kd_loss(section)
    errors += fold_kwarg_synonyms(section, name)
    spec, errs = check_target_section(section, name)
    errors += errs
    kind = SECTION_KINDS[name]
    if spec is not None and spec.kind != kind:
        msg = f"{spec.name} is a {spec.kind}, not a {kind}"
        errors.append(FieldError(f"{name}._target_", msg, f"name a {kind} here"))
    if name in ("dataset", "validation_dataset"):
        errors += check_dataset_values(section, name)
    return errors


def _absolutize(out: dict[str, Any], checks: dict[str, PathCheck]) -> None:
    """Local paths become absolute, so the worker reads what the API validated."""
    for loc, check in checks.items():
        if check.kind != "local" or check.path is None:
            continue
        *parents, key = loc.split(".")
        holder: Any = out
        for part in parents:
            holder = holder[int(part)] if isinstance(holder, list) else holder[part]
        holder[int(key) if isinstance(holder, list) else key] = str(check.path)


def _model_info(
    model: Any,
    checks: dict[str, PathCheck],
    roots: Roots | list[Path],
    section: str = "model",
    fetch: bool = False,
) -> tuple[ModelInfo, list[FieldError]]:
    """What the model's config says; `roots` are the data roots its file must stay in;
    `fetch`: a hub model's config may be fetched from the hub (`jobs.recipe.model.hub`)."""
    if not isinstance(model, dict):
        return ModelInfo(), []
    config, errors, revisions = model.get("config"), [], {}
    if not isinstance(config, dict) or is_target_section(config):
        config = None
        for loc, value in _config_sources(model, section):
            check = checks.get(loc)
            if check and check.kind == "local" and check.path is not None:
                config, errors = read_config_file(check.path, loc, roots)
            elif check and check.kind == "hub":
                file, commit, errors = hub_model_config(str(value), loc, fetch)
                if file is not None:
                    config, errors = read_config_file(file, loc, [hub_cache_root()])
                    revisions = {str(value): commit} if config is not None and commit else {}
    errs, warnings = _override_errors(model, section, config)
    built = config_with_overrides(config, model)
    info = ModelInfo(
        architecture_of(built), estimate_param_count(built), built, warnings, revisions
    )
    return info, errors + errs


def _config_sources(model: dict[str, Any], section: str) -> list[tuple[str, Any]]:
    """Where a model section's config.json comes from: (loc, the path or hub name)."""
    nested = model.get("config") if is_target_section(model.get("config")) else {}
    return [
        (f"{section}.pretrained_model_name_or_path", model.get("pretrained_model_name_or_path")),
        (f"{section}.config", model.get("config")),
        (
            f"{section}.config.pretrained_model_name_or_path",
            nested.get("pretrained_model_name_or_path"),
        ),
    ]


def _override_errors(
    model: dict[str, Any], section: str, config: dict[str, Any] | None
) -> tuple[list[FieldError], list[FieldError]]:
    """Config overrides on the loader and on a nested AutoConfig, against the stored config."""
    pretrained = "pretrained_model_name_or_path" in model
    errors, warnings = check_overrides(model, section, config, pretrained)
    if is_target_section(model.get("config")):
        errs, warns = check_overrides(model["config"], f"{section}.config", config, False)
        errors, warnings = errors + errs, warnings + warns
    return errors, warnings


def _teacher_errors(
    out: dict[str, Any],
    checks: dict[str, PathCheck],
    roots: Roots | list[Path],
    student: ModelInfo,
    fetch: bool,
) -> list[FieldError]:
    """A KD recipe's teacher: readable config, the student's vocabulary, a topology it can run."""
    if out["recipe"] != KD_RECIPE:
        return []
    teacher, errors = _model_info(out.get("teacher_model"), checks, roots, "teacher_model", fetch)
    out["hub_revisions"].update(teacher.revisions)
    errors += vocab_errors(student.config, teacher.config)
    return errors + kd_topology_errors(out.get("distributed"))


# Passes over the data when a recipe gives neither max_steps nor num_epochs (as AutoModel).
DEFAULT_NUM_EPOCHS = 10


def _batch_rules(out: dict[str, Any], setup: DistributedSetup | None) -> list[FieldError]:
    step, loader = out["step_scheduler"], out["dataloader"]
    if step.get("max_steps") is None and step.get("num_epochs") is None:
        step["num_epochs"] = DEFAULT_NUM_EPOCHS
    batches, errors = resolve_batches(step, loader, setup.dp_size if setup else None)
    if batches is not None:
        step.update(
            global_batch_size=batches.global_,
            local_batch_size=batches.local,
            grad_accumulation_steps=batches.grad_accumulation_steps,
        )
        loader["batch_size"] = batches.local
        if out["validation_dataloader"].get("batch_size") is None:
            out["validation_dataloader"]["batch_size"] = batches.local
    return errors


def _bounds(out: dict[str, Any], accelerator: str) -> list[FieldError]:
    errors: list[FieldError] = []
    optimizer = out.get("optimizer") if isinstance(out.get("optimizer"), dict) else {}
    errors += check_optimizer(optimizer)
    if isinstance(out.get("lr_scheduler"), dict):
        max_steps = out["step_scheduler"].get("max_steps")
        errors += check_lr_scheduler(out["lr_scheduler"], optimizer.get("lr"), max_steps)
        errors += check_warmup_decay(out["lr_scheduler"], optimizer.get("lr"), max_steps)
    errors += check_trainer_support(out, accelerator)
    dataset = out["dataset"] if isinstance(out.get("dataset"), dict) else {}
    loaders = {name: out[name] for name in ("dataloader", "validation_dataloader")}
    out["packed_sequence"], errs = check_packing(out["packed_sequence"], dataset, loaders)
    return errors + errs


def _target_section_warnings(out: dict[str, Any]) -> list[FieldError]:
    return [
        w
        for name in TARGET_SECTIONS
        if isinstance(out.get(name), dict)
        for w in target_warnings(out[name], name)
    ]


def automodel_forms(
    data: dict[str, Any], accelerator: str
) -> tuple[list[FieldError], list[FieldError]]:
    """AutoModel's side sections, ignored keys, value forms, keys without effect here and
    folded in place: (errors, warnings)."""
    warnings = fold_side_sections(data)
    errors, block_warnings = fold_automodel_blocks(data)
    warnings += block_warnings
    # In this order: value forms drop a `pipeline` block without pipelining before its keys
    # are looked at, and `none` sections before their contents are.
    for errs, warns in (
        fold_value_forms(data),
        fold_inert_keys(data),
        refused_features(data),
    ):
        errors, warnings = errors + errs, warnings + warns
    return errors, warnings


def normalize_recipe(
    data: dict[str, Any],
    resources: Any,
    settings: RecipeSettings,
    scope: JobScope | None = None,
) -> tuple[dict[str, Any], DistributedSetup | None, ModelInfo, list[FieldError], list[FieldError]]:
    """The normalized recipe, its DistributedSetup, what is known of the model, all errors,
    and the warnings: what was accepted but is not used."""
    errors, warnings = automodel_forms(data, resources.accelerator)
    errors += unknown_top_level(data)
    data = {k: v for k, v in data.items() if k in TOP_LEVEL_KEYS}
    errors += fold_synonyms(data)
    out: dict[str, Any] = {}
    out["recipe"], errs = check_recipe_name(data.get("recipe"))
    errs += prepare_kd_keys(data, out["recipe"])
    out["kd_ratio"], kd_errs = check_kd_ratio(data.get("kd_ratio"), out["recipe"])
    errs += kd_errs
    errors += errs + _fixed_sections(data, out)
    errors += _target_sections(data, out, settings, scope, warnings)
    errors += check_trackers(data, out, settings, scope, warnings)
    errs, bench_warnings = check_benchmark(data, out)
    errors, warnings = errors + errs + _stray_targets(out), warnings + bench_warnings
    setup, errs = setup_from_section(data.get("distributed"), resources.world_size)
    setup, notes = as_fsdp2(setup)  # checked as megatron_fsdp, runs (and is planned) as FSDP2
    warnings += notes
    out["distributed"] = setup.to_dict() if setup else None
    out["neftune"], neftune_errors, notes = check_neftune(data.get("neftune"), out["distributed"])
    errors, warnings = errors + neftune_errors, warnings + notes
    out["embedding_row_repair"], repair_errors, notes = check_embedding_row_repair(data)
    errors, warnings = errors + repair_errors, warnings + notes
    out["quantization"], quant_errors, notes = check_quantization(
        data.get("quantization"), out, resources.accelerator
    )
    errors, warnings = errors + quant_errors, warnings + notes
    roots = Roots.of(settings.allowed_data_roots())  # resolved once: every path, every read
    checks, path_errors = check_data_paths(out, settings, roots, scope)
    _absolutize(out, checks)
    errors += errs + path_errors
    errors += check_checkpoint_paths(out["checkpoint"], out["restore_from"], settings, scope)
    fetch = settings.hub_fetch and not settings.hub_offline
    info, errs = _model_info(out.get("model"), checks, roots, fetch=fetch)
    out["hub_revisions"] = dict(info.revisions)
    errors += errs + _teacher_errors(out, checks, roots, info, fetch)
    out["hub_revisions"].update(tokenizer_revisions(out, out["hub_revisions"], fetch))
    warnings += info.warnings + _target_section_warnings(out)
    errs, notes = check_moe_rank_scaling(out["peft"], info.config, info.architecture)
    errors, warnings = errors + errs, warnings + notes
    errors += mock_vocab_errors(out, info.config)
    if setup is not None:
        errors += capability_errors(info.architecture, out["distributed"], out["peft"] is not None)
        errors += context_parallel_config_errors(info.config, out["distributed"])
        errors += tensor_parallel_config_errors(info.config, out["distributed"], out.get("model"))
        errors += fused_lora_errors(info.config, out["peft"])
        errors += lora_target_errors(info.config, out["peft"], out.get("model"))
        experts = has_experts(info.config)
        errors += expert_target_errors(experts, info.architecture, out["peft"])
        errors += expert_parallel_config_errors(info.config, out["distributed"], out.get("model"))
        errors += pipeline_config_errors(info.config, out["distributed"], info.architecture)
    errors += _batch_rules(out, setup) + _bounds(out, resources.accelerator)
    errors += check_keep_best(out) + tokenizer_errors(out)
    return out, setup, info, errors, warnings
