"""Validated => runs: every refusal the trainer can make for a recipe reason has a rule at
submit time. The walk below finds the trainer's refusal sites (`unsupported(...)`, and
`TrainerError` with INVALID_RECIPE or UNSUPPORTED); a site with no entry in SUBMIT_TIME
fails, so a new trainer refusal cannot land without its validation rule. The cases after
it prove the rules refuse, at the field to change."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from recipe_asserts import error_at, write_model_dir

ROOT = Path(__file__).resolve().parents[5]
REFUSING_CODES = {"INVALID_RECIPE", "UNSUPPORTED"}

# (file, enclosing function) of each trainer refusal -> the submit-time code that refuses
# the same recipes first (so the trainer site is a guard that validated jobs never reach).
SUBMIT_TIME = {
    ("trainer/__main__.py", "_invalid"): "jobs.recipe.validation:validate_job",
    # a tracker package missing where the job runs: refused at submit against live workers
    ("trainer/trackers.py", "_require"): "jobs.recipe.plan.requirements:requirement_errors",
    ("trainer/builders.py", "build_target"): "jobs.recipe.targets.allowlist:check_target_section",
    ("trainer/parallelize.py", "apply_tensor_parallel"): "jobs.recipe.model.config:capability_errors",
    ("trainer/parallelize.py", "apply_expert_parallel"): "jobs.recipe.model.config:capability_errors",
    ("trainer/parallelize.py", "parallelize"): "jobs.recipe.topology.trainer_support:check_trainer_support",
    ("trainer/pipeline.py", "build_pipeline"): "jobs.recipe.topology.pipeline:pipeline_errors",
}  # fmt: skip


def _refuses(call: ast.Call) -> bool:
    name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
    if name == "unsupported":
        return True
    if name != "TrainerError" or not call.args:
        return False
    codes = {n.attr for n in ast.walk(call.args[0]) if isinstance(n, ast.Attribute)}
    return bool(codes & REFUSING_CODES)


def refusal_sites() -> set[tuple[str, str]]:
    sites = set()
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef) or func.name == "unsupported":
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and _refuses(node):
                    sites.add((str(path.relative_to(ROOT)), func.name))
    return sites


def test_every_trainer_refusal_has_a_submit_time_rule():
    sites = refusal_sites()
    assert sites, "the walk found no refusal site: it is broken"
    missing = sorted(sites - set(SUBMIT_TIME))
    assert not missing, f"trainer refusals with no submit-time rule in jobs.recipe: {missing}"
    for counterpart in SUBMIT_TIME.values():
        module, _, name = counterpart.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), counterpart


def test_the_walk_sees_a_new_refusal(tmp_path, monkeypatch):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "x.py").write_text(
        "def f():\n    raise unsupported('no')\n"
        "def g():\n    raise TrainerError(ExitCode.INVALID_RECIPE, 'no')\n"
        "def h():\n    raise TrainerError(ExitCode.DATA_ERROR, 'data')\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert refusal_sites() == {("trainer/x.py", "f"), ("trainer/x.py", "g")}


CASES = [
    ({"distributed": {"strategy": "ddp", "tp_size": 2}}, 2, "distributed.tp_size"),
    ({"distributed": {"strategy": "ddp", "ep_size": 2}}, 2, "distributed.ep_size"),
    ({"distributed": {"strategy": "fsdp2", "ep_size": 2, "tp_size": 2}}, 4, "distributed.ep_size"),
    ({"distributed": {"strategy": "fsdp2", "pp_size": 2}, "checkpoint": {"is_async": True}}, 2, "checkpoint.is_async"),
    ({"distributed": {"strategy": "fsdp2", "cp_size": 2}, "compile": {"enabled": True}}, 2, "compile.enabled"),
    ({"peft": {"dim": 4, "use_dora": True}, "distributed": {"strategy": "fsdp2", "tp_size": 2}}, 2, "distributed.tp_size"),
    ({"dist_env": {"backend": "nccl"}}, 1, "dist_env.backend"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "nproc", "loc"), CASES, ids=[c[2] + str(i) for i, c in enumerate(CASES)]
)
def test_each_rule_refuses_at_the_field_to_change(validate, recipe, change, nproc, loc):
    for section, values in change.items():
        recipe[section] = (
            {**recipe.get(section, {}), **values} if section == "distributed" else values
        )
    error = error_at(validate(recipe, nproc_per_node=nproc), loc)
    assert error.fix, error


def test_lora_with_tensor_parallelism_runs_on_the_common_dense_plan(validate, recipe):
    """The tiny Llama shards with the common dense plan, which places the adapters
    (tests/integration/trainer/test_lora_tp_runs.py proves it equal to a 1-process run)."""
    recipe["peft"] = {"dim": 4}
    recipe["distributed"].update(strategy="fsdp2", tp_size=2, sequence_parallel=True)
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]


def test_dora_with_tensor_parallelism_is_refused(validate, recipe):
    recipe["peft"] = {"dim": 4, "use_dora": True}
    recipe["distributed"].update(strategy="fsdp2", tp_size=2)
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.tp_size")
    assert "DoRA" in error.msg and "not supported" in error.msg and "use_dora" in error.fix


FAMILY_CONFIGS = {  # families whose own plans place LoRA adapters under tp
    "phi3": {"architectures": ["Phi3ForCausalLM"], "intermediate_size": 96, "resid_pdrop": 0.0},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "intermediate_size": 128, "head_dim": 32},
}
TINY_CORE = {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 256, "tie_word_embeddings": False}  # fmt: skip


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_lora_with_tensor_parallelism_runs_on_a_family_plan_that_places_it(
    validate, recipe, data_root, family
):
    """Their plans are the dense one plus norms or on split projections
    (tests/integration/trainer/test_family_lora_tp_runs.py proves each equal to one process);
    a plan that does not place adapters (DeepSeek-V3's latent attention) is refused in
    tests/unit/jobs/recipe/model/test_deepseek_v3_family_rules.py."""
    config = {**TINY_CORE, "model_type": family, **FAMILY_CONFIGS[family]}
    directory = write_model_dir(data_root / family, config)
    recipe["model"]["pretrained_model_name_or_path"] = str(directory)
    recipe["peft"] = {"dim": 4}
    recipe["distributed"].update(strategy="fsdp2", tp_size=2, sequence_parallel=True)
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]


def test_the_matching_backend_is_accepted(validate, recipe):
    recipe["dist_env"] = {"backend": "gloo"}
    assert validate(recipe).valid
    recipe["dist_env"] = {"backend": "nccl"}
    assert validate(recipe, accelerator="cuda").valid


@pytest.mark.parametrize("accelerator", ["cpu", "cuda"])
def test_megatron_fsdp_runs_as_fsdp2_on_both_accelerators(validate, recipe, accelerator):
    """The trainer runs megatron_fsdp as FSDP2 (gloo on CPU, nccl on CUDA): accepted, with
    the warning that says so (tests/unit/jobs/recipe/topology/test_megatron_fsdp_fold.py)."""
    recipe["distributed"].update(strategy="megatron_fsdp")
    result = validate(recipe, accelerator=accelerator)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.topology.strategy == "fsdp2"
    assert any(w.loc == "distributed.strategy" for w in result.warnings)


def test_lora_on_lm_head_with_sequence_parallelism_is_refused(validate, recipe):
    recipe["peft"] = {"dim": 4, "target_modules": ["q_proj", "*.lm_head"]}
    recipe["distributed"].update(strategy="fsdp2", tp_size=2, sequence_parallel=True)
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.sequence_parallel")
    assert "lm_head" in error.msg and "sequence_parallel: false" in error.fix
    recipe["distributed"].update(sequence_parallel=False)  # lm_head then stays whole
    assert validate(recipe, nproc_per_node=2).valid


def test_flash_attention_2_needs_a_cuda_job(validate, recipe):
    """flash-attn's kernels are CUDA-only: a CPU job with it is refused at the field (it
    validated and then crashed in the trainer with flash-attn's ImportError)."""
    recipe["model"]["attn_implementation"] = "flash_attention_2"
    error = error_at(validate(recipe), "model.attn_implementation")
    assert "CUDA" in error.msg and "sdpa" in error.fix
    assert not any(
        e.loc == "model.attn_implementation" for e in validate(recipe, accelerator="cuda").errors
    )
