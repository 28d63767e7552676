"""The `wandb:` and `mlflow:` sections: AutoModel's keys, what is refused, where paths go."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from recipe_asserts import error_at

from jobs.recipe.errors import FieldError
from jobs.recipe.paths.scope import JobScope
from jobs.recipe.sections.trackers import (
    WANDB_IGNORED,
    MlflowSection,
    WandbSection,
    check_trackers,
    tracker_packages,
)
from jobs.recipe.settings import RecipeSettings
from jobs.recipe.typed import Mlflow, Recipe, Wandb


def with_trackers(recipe: dict[str, Any], **sections: Any) -> dict[str, Any]:
    return {**recipe, **sections}


def warning_locs(result) -> list[str]:
    return [w.loc for w in result.warnings]


def test_the_dataclasses_carry_every_key_of_their_sections() -> None:
    assert [f.name for f in dataclasses.fields(Wandb)] == list(WandbSection.model_fields)
    assert [f.name for f in dataclasses.fields(Mlflow)] == list(MlflowSection.model_fields)


def test_automodel_blocks_validate_and_round_trip_through_the_stored_json(validate, recipe) -> None:
    wandb = {"project": "p", "entity": "team", "name": "run-1", "save_dir": "wandb-files",
             "group": "g", "tags": ["a", "b"], "notes": "n", "mode": "offline",
             "job_type": "sft", "id": "run-1.a_b", "resume": "allow"}  # fmt: skip
    mlflow = {"experiment_name": "e", "run_name": "r", "tracking_uri": "http://mlflow:5000",
              "artifact_location": "s3://bucket/artifacts", "tags": {"task": "squad"},
              "resume": False, "description": "d", "flatten_depth": None}  # fmt: skip
    result = validate(with_trackers(recipe, wandb=wandb, mlflow=mlflow))
    assert result.valid, [str(e) for e in result.errors]
    assert result.warnings == []
    assert result.typed.wandb == Wandb(**{**dataclasses.asdict(_wandb_defaults()), **wandb})
    assert result.typed.mlflow == Mlflow(**mlflow)
    stored = json.loads(json.dumps(result.typed.to_json()))
    assert Recipe.from_json(stored) == result.typed
    assert tracker_packages(result.recipe) == {"wandb", "mlflow"}


def _wandb_defaults() -> Wandb:
    return Wandb(**WandbSection().model_dump())


def test_defaults_are_filled_and_absent_sections_are_none(validate, recipe) -> None:
    result = validate(with_trackers(recipe, wandb={}))
    assert result.valid
    assert result.typed.wandb == _wandb_defaults() and result.typed.mlflow is None
    assert tracker_packages(result.recipe) == {"wandb"}
    result = validate(with_trackers(recipe, mlflow={"run_name": "r"}))
    assert result.typed.mlflow.experiment_name == "automodel-experiment"
    assert result.typed.mlflow.resume is True and result.typed.mlflow.flatten_depth == 1
    assert result.typed.wandb is None and tracker_packages(result.recipe) == {"mlflow"}


def test_a_recipe_stored_before_trackers_loads_without_them(validate, recipe) -> None:
    stored = validate(recipe).typed.to_json()
    for key in ("tokenizer", "wandb", "mlflow"):
        stored.pop(key)
    loaded = Recipe.from_json({**stored, "format": 1})
    assert loaded.wandb is None and loaded.mlflow is None


def test_an_empty_mlflow_section_is_a_warning_and_turns_nothing_on(validate, recipe) -> None:
    result = validate(with_trackers(recipe, mlflow={}))
    assert result.valid and result.typed.mlflow is None
    assert warning_locs(result) == ["mlflow"]
    assert tracker_packages(result.recipe) == set()


def test_every_ignored_wandb_init_keyword_is_a_warning(validate, recipe) -> None:
    ignored = dict.fromkeys(WANDB_IGNORED, True)
    result = validate(with_trackers(recipe, wandb={"project": "p", **ignored}))
    assert result.valid, [str(e) for e in result.errors]
    assert sorted(warning_locs(result)) == sorted(f"wandb.{k}" for k in WANDB_IGNORED)
    assert all(w.msg.startswith("accepted and ignored: ") for w in result.warnings)
    assert result.typed.wandb.project == "p"


def test_an_api_key_is_refused_with_the_environment_fix(validate, recipe) -> None:
    result = validate(with_trackers(recipe, wandb={"project": "p", "api_key": "secret"}))
    error = error_at(result, "wandb.api_key")
    assert "credential" in error.msg and "WANDB_API_KEY" in error.fix
    assert "secret" not in json.dumps([e.to_dict() for e in result.errors])


@pytest.mark.parametrize(
    ("section", "value", "loc", "fix"),
    [
        ("wandb", {"projct": "p"}, "wandb.projct", "did you mean 'project'?"),
        ("wandb", {"save_dirr": "x"}, "wandb.save_dirr", "did you mean 'save_dir'?"),
        ("mlflow", {"experiment": "e"}, "mlflow.experiment", "did you mean 'experiment_name'?"),
        ("mlflow", {"tracking_url": "x"}, "mlflow.tracking_url", "did you mean 'tracking_uri'?"),
    ],
)
def test_unknown_keys_are_refused_with_did_you_mean(validate, recipe, section, value, loc, fix):
    assert error_at(validate(with_trackers(recipe, **{section: value})), loc).fix == fix


@pytest.mark.parametrize(
    ("value", "loc"),
    [
        ({"wandb": "project-name"}, "wandb"),
        ({"mlflow": ["e"]}, "mlflow"),
        ({"wandb": {"mode": "shared"}}, "wandb.mode"),
        ({"wandb": {"tags": "a,b"}}, "wandb.tags"),
        ({"wandb": {"resume": "sometimes"}}, "wandb.resume"),
        ({"mlflow": {"tags": {"a": ["b"]}}}, "mlflow.tags.a"),
        ({"mlflow": {"flatten_depth": -1}}, "mlflow.flatten_depth"),
        ({"mlflow": {"resume": "yes"}}, "mlflow.resume"),
    ],
)
def test_wrong_shapes_are_refused_at_their_field(validate, recipe, value, loc) -> None:
    error = error_at(validate(with_trackers(recipe, **value)), loc)
    assert error.fix


def test_a_wandb_run_id_must_be_one_w_and_b_accepts(validate, recipe) -> None:
    error = error_at(validate(with_trackers(recipe, wandb={"id": "a/b"})), "wandb.id")
    assert "letters, digits" in error.fix


def test_dir_and_save_dir_may_not_disagree(validate, recipe) -> None:
    assert validate(with_trackers(recipe, wandb={"dir": "x", "save_dir": "x"})).valid
    result = validate(with_trackers(recipe, wandb={"dir": "x", "save_dir": "y"}))
    assert "give one of wandb.dir and wandb.save_dir" in error_at(result, "wandb.save_dir").fix


def test_mlflow_tags_of_yaml_scalars_become_text(validate, recipe) -> None:
    tags = {"size": 1, "lr": 1.0e-5, "peft": True, "task": "squad"}
    result = validate(with_trackers(recipe, mlflow={"tags": tags}))
    assert result.typed.mlflow.tags == {"size": "1", "lr": "1e-05", "peft": "true", "task": "squad"}


# Paths a tracker writes -----------------------------------------------------------------


@pytest.mark.parametrize("key", ["dir", "save_dir"])
def test_relative_wandb_dirs_stay_relative_for_the_run_directory(validate, recipe, key) -> None:
    result = validate(with_trackers(recipe, wandb={key: "./logs/../wandb"}))
    assert getattr(result.typed.wandb, key) == "wandb"


@pytest.mark.parametrize("value", ["..", "../elsewhere", "logs/../../x", "./a/../.."])
def test_relative_paths_that_climb_out_of_the_run_directory_are_refused(
    validate, recipe, value
) -> None:
    result = validate(with_trackers(recipe, wandb={"dir": value}))
    error = error_at(result, "wandb.dir")
    assert "escapes the run directory" in error.msg and "no '..'" in error.fix
    result = validate(with_trackers(recipe, mlflow={"tracking_uri": f"file:{value}"}))
    assert "escapes the run directory" in error_at(result, "mlflow.tracking_uri").msg


@pytest.mark.parametrize("value", ["", "  ", "a\x00b"])
def test_empty_or_nul_paths_are_refused(validate, recipe, value) -> None:
    assert error_at(validate(with_trackers(recipe, wandb={"dir": value})), "wandb.dir")


def test_absolute_paths_must_lie_in_the_checkpoint_roots(validate, recipe, ckpt_root, tmp_path):
    inside = ckpt_root / "trackers" / "wandb"
    result = validate(with_trackers(recipe, wandb={"save_dir": str(inside / ".." / "w")}))
    assert result.valid and result.typed.wandb.save_dir == str(ckpt_root / "trackers" / "w")
    outside = tmp_path / "elsewhere"
    result = validate(with_trackers(recipe, wandb={"dir": str(outside)}))
    error = error_at(result, "wandb.dir")
    assert "outside the allowed roots" in error.msg and "TUNEYARD_CHECKPOINT_ROOTS" in error.fix
    result = validate(with_trackers(recipe, wandb={"dir": f"{ckpt_root}/../elsewhere"}))
    assert "escapes the allowed roots" in error_at(result, "wandb.dir").msg


def test_a_symlink_out_of_the_checkpoint_roots_is_refused(validate, recipe, ckpt_root, tmp_path):
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", ckpt_root / "link")
    result = validate(with_trackers(recipe, mlflow={"artifact_location": f"{ckpt_root}/link/a"}))
    assert "symlink" in error_at(result, "mlflow.artifact_location").msg


def test_with_a_scope_a_path_in_another_projects_run_is_refused(ckpt_root, tmp_path) -> None:
    settings = RecipeSettings(home=tmp_path / "home", checkpoint_roots=str(ckpt_root),
                              runs_dir=ckpt_root / "runs")  # fmt: skip
    scope = JobScope("mine", owns_job=lambda job: job == "job-mine")
    for job, refused in (("job-mine", False), ("job-theirs", True)):
        out: dict[str, Any] = {}
        data = {"wandb": {"dir": str(ckpt_root / "runs" / job / "wandb")}}
        errors = check_trackers(data, out, settings, scope)
        assert bool(errors) is refused, errors
        assert (out["wandb"] is None) is refused
    errors = check_trackers({"wandb": {"dir": str(ckpt_root / "runs")}}, {}, settings, scope)
    assert "outside project mine's checkpoint directories" in errors[0].msg


@pytest.mark.parametrize(
    ("uri", "stored"),
    [
        ("http://mlflow.internal:5000", "http://mlflow.internal:5000"),
        ("https://mlflow.example.com/", "https://mlflow.example.com/"),
        ("file:./mlruns", "file:mlruns"),
        ("file:mlruns", "file:mlruns"),
        ("mlruns", "file:mlruns"),
        ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
        ("sqlite:///db/./m.db", "sqlite:///db/m.db"),
    ],
)
def test_tracking_uris_that_stay_in_the_job(validate, recipe, uri, stored) -> None:
    result = validate(with_trackers(recipe, mlflow={"tracking_uri": uri}))
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.mlflow.tracking_uri == stored


def test_absolute_file_and_sqlite_stores_are_checked_against_the_roots(
    validate, recipe, ckpt_root, tmp_path
) -> None:
    for uri in (f"file://{ckpt_root}/mlruns", f"file:{ckpt_root}/mlruns",
                f"file://localhost{ckpt_root}/mlruns"):  # fmt: skip
        result = validate(with_trackers(recipe, mlflow={"tracking_uri": uri}))
        assert result.typed.mlflow.tracking_uri == f"file:{ckpt_root}/mlruns", uri
    result = validate(with_trackers(recipe, mlflow={"tracking_uri": f"sqlite:///{ckpt_root}/m.db"}))
    assert result.typed.mlflow.tracking_uri == f"sqlite:///{ckpt_root}/m.db"
    for uri in (f"file://{tmp_path}/x", f"sqlite:///{tmp_path}/m.db", "/var/mlruns"):
        result = validate(with_trackers(recipe, mlflow={"tracking_uri": uri}))
        assert "outside the allowed roots" in error_at(result, "mlflow.tracking_uri").msg, uri


@pytest.mark.parametrize(
    ("uri", "msg", "fix"),
    [
        ("https://user:pw@mlflow.example.com", "user name or password", "MLFLOW_TRACKING_PASSWORD"),
        ("http://", "names no host", "http(s)://host"),
        ("postgresql://u:pw@db/mlflow", "puts its password in the recipe", "MLFLOW_TRACKING_URI"),
        ("mysql+pymysql://u:pw@db/mlflow", "puts its password", "tracking server"),
        ("sqlite://", "not a sqlite database file", "sqlite:///<path>"),
        ("sqlite:///", "not a sqlite database file", "sqlite:///<path>"),
        ("sqlite:///m.db?mode=ro", "not a sqlite database file", "sqlite:///<path>"),
        ("file://fileserver/share/mlruns", "names host 'fileserver'", "file:<path>"),
        ("databricks", "databricks: is not a tracking store", "http(s)://"),
        ("ftp://host/x", "ftp: is not a tracking store", "MLFLOW_TRACKING_URI"),
    ],
)
def test_tracking_uris_refused(validate, recipe, uri, msg, fix) -> None:
    error = error_at(
        validate(with_trackers(recipe, mlflow={"tracking_uri": uri})), "mlflow.tracking_uri"
    )
    assert msg in error.msg and fix in error.fix
    assert "pw" not in error.msg


@pytest.mark.parametrize(
    ("location", "stored"),
    [
        ("s3://bucket/prefix", "s3://bucket/prefix"),
        ("gs://bucket/prefix", "gs://bucket/prefix"),
        ("mlflow-artifacts:/exp", "mlflow-artifacts:/exp"),
        ("artifacts", "file:artifacts"),
        ("file:./artifacts", "file:artifacts"),
    ],
)
def test_artifact_locations_accepted(validate, recipe, location, stored) -> None:
    result = validate(with_trackers(recipe, mlflow={"artifact_location": location}))
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.mlflow.artifact_location == stored


@pytest.mark.parametrize(
    ("location", "msg"),
    [
        ("../artifacts", "escapes the run directory"),
        ("/srv/artifacts", "outside the allowed roots"),
        ("file:///srv/artifacts", "outside the allowed roots"),
        ("ftp://host/artifacts", "ftp: is not an artifact store"),
        ("s3://key:secret@bucket/x", "user name or password"),
    ],
)
def test_artifact_locations_refused(validate, recipe, location, msg) -> None:
    result = validate(with_trackers(recipe, mlflow={"artifact_location": location}))
    error = error_at(result, "mlflow.artifact_location")
    assert msg in error.msg and error.fix


def test_every_error_of_both_sections_is_reported_at_once(validate, recipe) -> None:
    result = validate(
        with_trackers(
            recipe,
            wandb={"dir": "../x", "api_key": "k"},
            mlflow={"tracking_uri": "postgresql://db/m", "artifact_location": "/srv/a"},
        )
    )
    locs = {e.loc for e in result.errors}
    assert {"wandb.dir", "wandb.api_key", "mlflow.tracking_uri",
            "mlflow.artifact_location"} <= locs  # fmt: skip
    assert result.recipe is None or result.recipe.get("wandb") is None


def test_check_trackers_fills_out_and_appends_warnings(tmp_path: Path) -> None:
    settings = RecipeSettings(home=tmp_path, checkpoint_roots=str(tmp_path))
    out: dict[str, Any] = {}
    warnings: list[FieldError] = []
    errors = check_trackers({"wandb": {"save_code": True}}, out, settings, None, warnings)
    assert errors == [] and out["mlflow"] is None and out["wandb"]["project"] is None
    assert [w.loc for w in warnings] == ["wandb.save_code"]
