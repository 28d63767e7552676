"""AutoModel features tuneyard does not run, answered with what they do and the fix
(jobs.recipe.automodel.refused), and torchao's QAT settings ignored beside qat.enabled."""

from __future__ import annotations

from recipe_asserts import error_at

from jobs.recipe.automodel.refused import PREFIX_TREE, SECTIONS


def test_embedding_row_repair_is_run_not_refused(validate, recipe):
    # the trainer repairs the rows (jobs.recipe.sections.embedding_row_repair)
    assert "embedding_row_repair" not in SECTIONS
    recipe["embedding_row_repair"] = {"min_norm": 1.0e-4, "max_rows": 256}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.embedding_row_repair.min_norm == 1.0e-4


def test_a_separate_teacher_mesh_is_refused_precisely(validate, recipe):
    recipe["separate_meshes"] = True
    recipe["teacher_distributed"] = {"strategy": "fsdp2", "dp_size": 1, "tp_size": 2}
    result = validate(recipe)
    mesh, layout = error_at(result, "separate_meshes"), error_at(result, "teacher_distributed")
    assert "mesh of its own" in mesh.msg and "shards the teacher like the student" in mesh.msg
    assert "remove separate_meshes and teacher_distributed" in mesh.fix
    assert "remove teacher_distributed" in layout.fix
    del recipe["teacher_distributed"]
    recipe["separate_meshes"] = False
    result = validate(recipe)
    assert result.valid and any(w.loc == "separate_meshes" for w in result.warnings)


def test_tool_call_eval_only_measures_so_it_is_a_warning(validate, recipe):
    recipe["tool_call_eval"] = {
        "_target_": "nemo_automodel.components.eval.tool_call_evaluator.ToolCallAccuracyEvaluator",
        "max_new_tokens": 256,
    }
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    note = next(w for w in result.warnings if w.loc == "tool_call_eval")
    assert "does not change training" in note.msg and "loss only" in note.msg


def test_the_prefix_tree_collater_is_refused_at_its_field(validate, recipe):
    recipe["dataloader"]["collate_fn"] = PREFIX_TREE
    error = error_at(validate(recipe), "dataloader.collate_fn")
    assert "tree attention mask" in error.msg and "default collater" in error.fix
    assert len([e for e in validate(recipe).errors if e.loc == "dataloader.collate_fn"]) == 1


def test_qat_config_is_ignored_and_qat_itself_answers(validate, recipe):
    qat_config = {"_target_": "nemo_automodel.components.quantization.qat.QATConfig",
                  "quantizer_type": "int8_dynact_int4weight"}  # fmt: skip
    recipe["qat"] = {"enabled": True, "fake_quant_after_n_steps": 1, "qat_config": qat_config}
    result = validate(recipe, accelerator="cuda")
    assert [e.loc for e in result.errors] == ["qat.enabled"]
    assert any(w.loc == "qat.qat_config" for w in result.warnings)
