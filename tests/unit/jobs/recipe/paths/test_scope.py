"""A job's checkpoint and restore paths stay inside its own project's runs (issue 11, item 6).

Run directories are `<runs_dir>/<job id>`; a `JobScope` says which ids are the caller's.
"""

from __future__ import annotations

import copy
import shutil
import uuid
from pathlib import Path

import pytest
from recipe_asserts import error_at

from jobs.recipe.paths.scope import JobScope
from jobs.recipe.validation import validate_job

OURS, THEIRS = str(uuid.uuid4()), str(uuid.uuid4())


@pytest.fixture
def runs(settings):
    runs = settings.resolved_runs_dir
    for job in (OURS, THEIRS):
        step = runs / job / "checkpoints" / "step_5"
        step.mkdir(parents=True)
        (step / "trainer_state.json").write_text("{}")
        (runs / job / "checkpoints" / "step_10").mkdir()
        (runs / job / "checkpoints" / "LATEST").write_text("step_10\n")
    return runs


@pytest.fixture
def scope():
    return JobScope(project="alpha", owns_job=lambda job: job == OURS)


@pytest.fixture
def scoped(settings, scope):
    def run(recipe, job_scope=scope):
        return validate_job(copy.deepcopy(recipe), settings=settings, scope=job_scope)

    return run


def test_checkpoint_dir_in_another_projects_run_is_refused(scoped, recipe, runs):
    recipe["checkpoint"] = {"checkpoint_dir": str(runs / THEIRS / "checkpoints")}
    error = error_at(scoped(recipe), "checkpoint.checkpoint_dir")
    assert "alpha" in error.msg
    recipe["checkpoint"] = {"checkpoint_dir": str(runs / OURS / "more")}
    assert scoped(recipe).valid


@pytest.mark.parametrize("where", ["", "not-a-job", "..x"])
def test_checkpoint_dir_elsewhere_in_the_runs_dir_is_refused(scoped, recipe, runs, where):
    recipe["checkpoint"] = {"checkpoint_dir": str(runs / where) if where else str(runs)}
    error_at(scoped(recipe), "checkpoint.checkpoint_dir")


def test_restore_path_in_another_projects_run_is_refused(scoped, recipe, runs):
    recipe["restore_from"] = {"path": str(runs / THEIRS / "checkpoints" / "step_5")}
    error_at(scoped(recipe), "restore_from.path")
    recipe["restore_from"] = str(runs / OURS / "checkpoints" / "step_5")
    assert scoped(recipe).valid


def test_a_symlink_into_another_projects_run_is_refused(scoped, recipe, runs, ckpt_root):
    (ckpt_root / "sneaky").symlink_to(runs / THEIRS / "checkpoints")
    recipe["restore_from"] = {"path": str(ckpt_root / "sneaky" / "step_5")}
    error_at(scoped(recipe), "restore_from.path")
    recipe["restore_from"] = None
    recipe["checkpoint"] = {"checkpoint_dir": str(ckpt_root / "sneaky")}
    error_at(scoped(recipe), "checkpoint.checkpoint_dir")


def test_data_paths_inside_another_projects_run_are_refused(settings, scope, recipe, runs):
    """With the runs dir inside a data root, a model path could read another run's weights."""
    settings = settings.model_copy(update={"data_roots": f"{settings.data_roots}:{runs}"})
    (runs / THEIRS / "model").mkdir()
    (runs / THEIRS / "model" / "config.json").write_text("{}")
    recipe["model"]["pretrained_model_name_or_path"] = str(runs / THEIRS / "model")
    result = validate_job(copy.deepcopy(recipe), settings=settings, scope=scope)
    error_at(result, "model.pretrained_model_name_or_path")


def test_without_a_scope_paths_are_only_root_checked(validate, recipe, runs):
    recipe["restore_from"] = {"path": str(runs / THEIRS / "checkpoints" / "step_5")}
    assert validate(recipe).valid


def test_restore_from_a_job_and_step(scoped, recipe, runs):
    recipe["restore_from"] = {"job": OURS, "step": 5}
    result = scoped(recipe)
    assert result.valid, result.errors
    assert result.recipe["restore_from"] == {"path": str(runs / OURS / "checkpoints" / "step_5")}


def test_restore_from_a_job_without_a_step_is_its_latest(scoped, recipe, runs):
    recipe["restore_from"] = {"job": OURS}
    result = scoped(recipe)
    assert result.valid, result.errors
    assert result.recipe["restore_from"]["path"] == str(runs / OURS / "checkpoints" / "step_10")


def test_restore_from_a_job_uses_its_own_checkpoint_dir(scoped, recipe, runs, ckpt_root):
    own = ckpt_root / "projects" / "alpha" / "mine"  # in the project's own directory of the root
    (own / "step_3").mkdir(parents=True)
    (own / "LATEST").write_text("step_3")
    scope = JobScope("alpha", lambda job: job == OURS, lambda job: str(own))
    recipe["restore_from"] = {"job": OURS}
    assert scoped(recipe, scope).recipe["restore_from"]["path"] == str(own / "step_3")


@pytest.mark.parametrize("job", [THEIRS, str(uuid.uuid4()), "../x", OURS.upper()])
def test_restore_from_a_foreign_or_unknown_job(scoped, recipe, runs, job):
    recipe["restore_from"] = {"job": job, "step": 5}
    error = error_at(scoped(recipe), "restore_from.job")
    assert error.msg == f"no job {job} in project alpha"


def test_restore_from_a_missing_step(scoped, recipe, runs):
    recipe["restore_from"] = {"job": OURS, "step": 7}
    error = error_at(scoped(recipe), "restore_from.step")
    assert "step_5" in error.fix and "step_10" in error.fix


def test_restore_from_a_job_without_checkpoints(scoped, recipe, runs):
    (runs / OURS / "checkpoints" / "LATEST").unlink()
    recipe["restore_from"] = {"job": OURS}
    assert "no checkpoint" in error_at(scoped(recipe), "restore_from.job").msg


def test_a_latest_pointer_that_walks_away_is_refused(scoped, recipe, runs):
    (runs / OURS / "checkpoints" / "LATEST").write_text(f"../../{THEIRS}/checkpoints/step_5")
    recipe["restore_from"] = {"job": OURS}
    error_at(scoped(recipe), "restore_from.job")


def test_restore_from_a_job_needs_the_server(validate, recipe, runs):
    recipe["restore_from"] = {"job": OURS, "step": 5}
    assert "server" in error_at(validate(recipe), "restore_from.job").fix


@pytest.mark.parametrize(
    ("value", "loc"),
    [
        ({"job": OURS, "path": "LATEST"}, "restore_from.job"),
        ({"path": "LATEST", "step": 5}, "restore_from.step"),
        ({"job": OURS, "step": 0}, "restore_from.step"),
        ({"job": OURS, "step": "5"}, "restore_from.step"),
        ({"job": 5}, "restore_from.job"),
        ({}, "restore_from.path"),
    ],
)
def test_restore_from_form_errors(scoped, recipe, runs, value, loc):
    recipe["restore_from"] = value
    error_at(scoped(recipe), loc)


# --- a project's own part of the checkpoint roots (issue 28) -------------------------------


def _refusals(result):
    return [(e.loc, e.msg, e.fix) for e in result.errors]


def test_a_projects_subtree_is_its_own_and_no_other_projects(scoped, recipe, ckpt_root):
    recipe["checkpoint"] = {"checkpoint_dir": str(ckpt_root / "projects" / "alpha" / "x")}
    result = scoped(recipe)
    assert result.valid, result.errors
    assert result.recipe["checkpoint"]["checkpoint_dir"] == str(
        ckpt_root / "projects" / "alpha" / "x"
    )
    for elsewhere in ("beta/x", "x", "alpha-two/x", "alpha/../beta"):
        recipe["checkpoint"] = {"checkpoint_dir": str(ckpt_root / "projects" / elsewhere)}
        assert "alpha" in error_at(scoped(recipe), "checkpoint.checkpoint_dir").msg
    for shared in (ckpt_root, ckpt_root / "x", ckpt_root / "projects"):  # everyone's
        recipe["checkpoint"] = {"checkpoint_dir": str(shared)}
        error_at(scoped(recipe), "checkpoint.checkpoint_dir")


def test_another_projects_step_gets_one_answer_whether_it_exists_or_not(scoped, recipe, ckpt_root):
    recipe["restore_from"] = {"path": str(ckpt_root / "projects" / "beta" / "run" / "step_1")}
    before = _refusals(scoped(recipe))
    (ckpt_root / "projects" / "beta" / "run" / "step_1").mkdir(parents=True)
    (ckpt_root / "projects" / "beta" / "run" / "step_1" / "trainer_state.json").write_text("{}")
    assert _refusals(scoped(recipe)) == before
    assert [loc for loc, _, _ in before] == ["restore_from.path"]


def test_another_projects_run_gets_one_answer_whether_it_exists_or_not(scoped, recipe, runs):
    recipe["restore_from"] = {"path": str(runs / THEIRS / "checkpoints" / "step_7")}
    before = _refusals(scoped(recipe))
    (runs / THEIRS / "checkpoints" / "step_7").mkdir()
    assert _refusals(scoped(recipe)) == before
    recipe["restore_from"] = {"path": str(runs / THEIRS / "checkpoints" / "step_5")}
    assert [m for _, m, _ in before] == [
        m.replace("step_5", "step_7") for _, m, _ in _refusals(scoped(recipe))
    ]


def test_a_symlink_from_the_subtree_into_another_is_refused(scoped, recipe, ckpt_root):
    (ckpt_root / "projects" / "alpha").mkdir(parents=True)
    link = ckpt_root / "projects" / "alpha" / "link"
    link.symlink_to(ckpt_root / "projects" / "beta" / "run", target_is_directory=True)
    recipe["restore_from"] = {"path": str(link / "step_1")}
    restore_before = _refusals(scoped(recipe))
    recipe["restore_from"] = None
    recipe["checkpoint"] = {"checkpoint_dir": str(link)}
    write_before = _refusals(scoped(recipe))
    (ckpt_root / "projects" / "beta" / "run" / "step_1").mkdir(parents=True)
    assert _refusals(scoped(recipe)) == write_before
    recipe["checkpoint"] = None
    recipe["restore_from"] = {"path": str(link / "step_1")}
    assert _refusals(scoped(recipe)) == restore_before
    assert [loc for loc, _, _ in restore_before + write_before] == [
        "restore_from.path",
        "checkpoint.checkpoint_dir",
    ]


@pytest.mark.parametrize(
    ("value", "kept"), [("checkpoints/", "checkpoints"), ("a/../b", "b"), ("./c/d", "c/d")]
)
def test_a_relative_checkpoint_dir_is_kept_for_the_run_directory(
    scoped, validate, recipe, ckpt_root, monkeypatch, value, kept
):
    recipe["checkpoint"] = {"checkpoint_dir": value}
    result = scoped(recipe)
    assert result.valid, result.errors
    assert result.recipe["checkpoint"]["checkpoint_dir"] == kept
    monkeypatch.chdir(ckpt_root)  # without a scope: the working directory, as before
    assert validate(recipe).recipe["checkpoint"]["checkpoint_dir"] == str(ckpt_root / kept)


@pytest.mark.parametrize("value", ["..", "../x", "a/../../x"])
def test_a_relative_checkpoint_dir_cannot_climb_out_of_the_run(scoped, recipe, value):
    recipe["checkpoint"] = {"checkpoint_dir": value}
    assert "run directory" in error_at(scoped(recipe), "checkpoint.checkpoint_dir").msg


@pytest.mark.parametrize("project", ["alpha/beta", "alpha/..", "", " alpha"])
def test_a_project_name_that_is_no_directory_name_has_no_subtree(
    settings, recipe, ckpt_root, project
):
    scope = JobScope(project=project, owns_job=lambda job: False)
    recipe["checkpoint"] = {"checkpoint_dir": str(ckpt_root / "projects" / project / "x")}
    result = validate_job(copy.deepcopy(recipe), settings=settings, scope=scope)
    error_at(result, "checkpoint.checkpoint_dir")


def test_a_project_named_like_the_runs_dir_owns_no_run(settings, recipe, ckpt_root, runs):
    scope = JobScope(project="runs", owns_job=lambda job: False)  # runs dir: <ckpt_root>/runs
    for path in (runs / THEIRS / "checkpoints", runs / "x", ckpt_root / "projects" / "beta"):
        recipe["checkpoint"] = {"checkpoint_dir": str(path)}
        result = validate_job(copy.deepcopy(recipe), settings=settings, scope=scope)
        assert "runs" in error_at(result, "checkpoint.checkpoint_dir").msg


def test_a_job_that_kept_checkpoints_outside_its_subtree_is_not_read(scoped, recipe, ckpt_root):
    """A job stored before issue 28 may keep a shared directory: its LATEST and steps may be
    another project's, so restoring from it by id is refused before anything there is read."""
    legacy = ckpt_root / "legacy"
    scope = JobScope("alpha", lambda job: job == OURS, lambda job: str(legacy))
    recipe["restore_from"] = {"job": OURS}
    before = _refusals(scoped(recipe, scope))
    publish = legacy / "step_3"
    publish.mkdir(parents=True)
    (legacy / "LATEST").write_text("step_3")
    assert _refusals(scoped(recipe, scope)) == before
    assert [loc for loc, _, _ in before] == ["restore_from.job"]


def test_restore_from_a_job_with_a_run_relative_checkpoint_dir(scoped, recipe, runs):
    (runs / OURS / "own" / "step_4").mkdir(parents=True)
    scope = JobScope("alpha", lambda job: job == OURS, lambda job: "own")
    recipe["restore_from"] = {"job": OURS, "step": 4}
    result = scoped(recipe, scope)
    assert result.valid, result.errors
    assert result.recipe["restore_from"] == {"path": str(runs / OURS / "own" / "step_4")}


def test_tracker_paths_stay_in_the_projects_subtree(scoped, recipe, ckpt_root):
    recipe["wandb"] = {"dir": str(ckpt_root / "projects" / "alpha" / "wandb"), "mode": "offline"}
    result = scoped(recipe)
    assert result.valid, result.errors
    recipe["wandb"] = {"dir": str(ckpt_root / "projects" / "beta" / "wandb"), "mode": "offline"}
    assert "alpha" in error_at(scoped(recipe), "wandb.dir").msg
    recipe["wandb"] = None
    recipe["mlflow"] = {"tracking_uri": f"file:{ckpt_root / 'projects' / 'beta' / 'mlruns'}"}
    error_at(scoped(recipe), "mlflow.tracking_uri")


def test_a_model_in_another_projects_checkpoints_is_refused(
    settings, scope, recipe, data_root, ckpt_root, model_dir
):
    """With the data roots holding the checkpoint root (as the default roots do), reading
    another project's checkpoint as a model is refused with one answer whether it exists or
    not, also through a symlink; the project's own checkpoints and the rest of the root
    (where datasets may live) stay readable."""
    shared = settings.model_copy(update={"data_roots": f"{data_root}:{ckpt_root}"})

    def check(model_path: Path):
        recipe["model"]["pretrained_model_name_or_path"] = str(model_path)
        return validate_job(copy.deepcopy(recipe), settings=shared, scope=scope)

    theirs = ckpt_root / "projects" / "beta" / "run" / "step_5" / "model"
    before = _refusals(check(theirs))
    shutil.copytree(model_dir, theirs)
    assert _refusals(check(theirs)) == before
    assert [loc for loc, _, _ in before] == ["model.pretrained_model_name_or_path"]
    link = ckpt_root / "projects" / "alpha" / "borrowed"
    link.parent.mkdir(parents=True)
    link.symlink_to(theirs, target_is_directory=True)
    assert _refusals(check(link)) == [
        (before[0][0], before[0][1].replace(str(theirs), str(link)), before[0][2])
    ]
    for readable in (ckpt_root / "projects" / "alpha" / "mine", ckpt_root / "models" / "tiny"):
        shutil.copytree(model_dir, readable)
        result = check(readable)
        assert result.valid, result.errors


def test_a_data_path_in_another_projects_part_is_refused_without_resolving_it(
    scoped, recipe, ckpt_root, monkeypatch
):
    """Its text decides: nothing under another project's directory is looked at."""
    import os.path

    theirs = ckpt_root / "projects" / "beta" / "data"
    theirs.mkdir(parents=True)
    real, resolved = os.path.realpath, []
    monkeypatch.setattr(os.path, "realpath", lambda p, **k: resolved.append(str(p)) or real(p, **k))
    recipe["dataset"]["path_or_dataset"] = str(theirs)
    assert "another project" in error_at(scoped(recipe), "dataset.path_or_dataset").msg
    assert not [p for p in resolved if p.startswith(str(ckpt_root / "projects" / "beta"))]
