"""Allowed roots for model, tokenizer, data and checkpoint paths (issue 2, section 7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from recipe_asserts import error_at

from jobs.recipe.errors import shown
from jobs.recipe.paths.roots import is_hub_name

DATA_FIELDS = [
    ("model", "pretrained_model_name_or_path"),
    ("dataset", "path_or_dataset"),
    ("dataset", "tokenizer_name_or_path"),
]


@pytest.mark.parametrize(("section", "key"), DATA_FIELDS)
def test_absolute_path_outside_the_roots(validate, recipe, tmp_path, section, key):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    recipe[section][key] = str(outside)
    assert "outside" in error_at(validate(recipe), f"{section}.{key}").msg


@pytest.mark.parametrize(("section", "key"), DATA_FIELDS)
def test_dotdot_escape(validate, recipe, data_root, section, key):
    recipe[section][key] = str(data_root / ".." / "ckpt")
    assert "'..'" in error_at(validate(recipe), f"{section}.{key}").msg


def test_relative_dotdot_escape(validate, recipe, data_root, monkeypatch):
    monkeypatch.chdir(data_root)
    recipe["dataset"]["path_or_dataset"] = "../ckpt"
    error_at(validate(recipe), "dataset.path_or_dataset")


def test_relative_path_inside_a_root_is_made_absolute(validate, recipe, data_root, monkeypatch):
    monkeypatch.chdir(data_root)
    recipe["dataset"]["path_or_dataset"] = "squad"
    result = validate(recipe)
    assert result.recipe["dataset"]["path_or_dataset"] == str(data_root / "squad")


def test_symlink_leading_out(validate, recipe, data_root, tmp_path):
    target = tmp_path / "secret"
    target.mkdir()
    os.symlink(target, data_root / "link")
    recipe["dataset"]["path_or_dataset"] = str(data_root / "link")
    assert "symlink" in error_at(validate(recipe), "dataset.path_or_dataset").msg


def test_missing_local_path(validate, recipe, data_root):
    recipe["dataset"]["path_or_dataset"] = str(data_root / "nothing" / "here")
    assert "does not exist" in error_at(validate(recipe), "dataset.path_or_dataset").msg


def test_hub_names_stay_allowed(validate, recipe):
    recipe["model"]["pretrained_model_name_or_path"] = "meta-llama/Llama-3.2-1B"
    recipe["dataset"].update(path_or_dataset="rajpurkar/squad", tokenizer_name_or_path="org/tok")
    result = validate(recipe)
    assert result.valid and result.recipe["dataset"]["path_or_dataset"] == "rajpurkar/squad"


@pytest.mark.parametrize(
    ("value", "hub"),
    [
        ("org/name", True),
        ("org/name-1.5B", True),
        ("/org/name", False),
        ("../x", False),
        ("a/b/c", False),
        ("org/..", False),
        ("name", False),
    ],
)
def test_hub_name_form(value, hub):
    assert is_hub_name(value) is hub


def test_validation_dataset_paths_are_checked(validate, recipe, tmp_path):
    recipe["validation_dataset"] = {
        "_target_": "tuneyard.datasets.SquadDataset",
        "path_or_dataset": str(tmp_path),
        "split": "validation",
    }
    error_at(validate(recipe), "validation_dataset.path_or_dataset")


def test_jsonl_dataset_path_is_checked(validate, recipe, tmp_path):
    recipe["dataset"] = {
        "_target_": "tuneyard.datasets.JsonlInstructionDataset",
        "path": "/etc/passwd",
    }
    error_at(validate(recipe), "dataset.path")


def test_checkpoint_dir_inside_checkpoint_roots(validate, recipe, ckpt_root, data_root):
    recipe["checkpoint"] = {"checkpoint_dir": str(ckpt_root / "new" / "dir")}
    result = validate(recipe)
    assert result.valid and result.recipe["checkpoint"]["checkpoint_dir"].startswith(str(ckpt_root))
    recipe["checkpoint"] = {"checkpoint_dir": str(data_root / "ckpts")}
    assert (
        "TUNEYARD_CHECKPOINT_ROOTS" in error_at(validate(recipe), "checkpoint.checkpoint_dir").fix
    )


def test_restore_from_path_rules(validate, recipe, ckpt_root, tmp_path):
    recipe["restore_from"] = {"path": str(tmp_path / "elsewhere")}
    error_at(validate(recipe), "restore_from.path")
    recipe["restore_from"] = {"path": str(ckpt_root / "missing")}
    assert "does not exist" in error_at(validate(recipe), "restore_from.path").msg
    recipe["restore_from"] = {"path": str(ckpt_root / ".." / "data")}
    error_at(validate(recipe), "restore_from.path")
    recipe["restore_from"] = {"path": "LATEST"}
    assert validate(recipe).valid


def test_empty_path_value(validate, recipe):
    recipe["dataset"]["path_or_dataset"] = ""
    error_at(validate(recipe), "dataset.path_or_dataset")


# --- name fields are names, never paths (issue 11, item 6) --------------------------------

NAME_FIELDS = [
    ("tuneyard.datasets.SquadDataset", "split"),
    ("tuneyard.datasets.JsonlInstructionDataset", "prompt_field"),
    ("tuneyard.datasets.JsonlInstructionDataset", "completion_field"),
    ("tuneyard.datasets.JsonlInstructionDataset", "messages_field"),
]


def _dataset_with(recipe, data_root, target, key, value):
    if target == "tuneyard.datasets.JsonlInstructionDataset":
        (data_root / "rows.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        recipe["dataset"] = {"_target_": target, "path": str(data_root / "rows.jsonl")}
    recipe["dataset"][key] = value


@pytest.mark.parametrize(("target", "key"), NAME_FIELDS)
@pytest.mark.parametrize(
    "value", ["../../outside/stolen", "a/b", "/etc/passwd", "..", "x\\y", "sub/../x", "", "a\x00"]
)
def test_name_fields_refuse_paths(validate, recipe, data_root, target, key, value):
    _dataset_with(recipe, data_root, target, key, value)
    error_at(validate(recipe), f"dataset.{key}")


@pytest.mark.parametrize("value", ["train", "validation", "train[:100]", "train[10%:]", "test+dev"])
def test_split_names_and_slices_stay_allowed(validate, recipe, value):
    recipe["dataset"]["split"] = value
    assert validate(recipe).valid, value


def test_split_escape_reads_nothing_outside_the_roots(validate, recipe, tmp_path):
    """`split` is joined onto the dataset directory by the trainer (`<dir>/<split>.json`)."""
    stolen = tmp_path / "outside" / "stolen.json"
    stolen.parent.mkdir()
    stolen.write_text("[]")
    recipe["dataset"]["split"] = "../../outside/stolen"
    assert "path" in error_at(validate(recipe), "dataset.split").msg


def test_validation_dataset_names_are_checked(validate, recipe, squad_dir):
    recipe["validation_dataset"] = {
        "_target_": "tuneyard.datasets.SquadDataset",
        "path_or_dataset": str(squad_dir),
        "split": "../validation",
    }
    error_at(validate(recipe), "validation_dataset.split")


def test_every_dataset_keyword_is_a_path_a_name_or_a_number():
    """A new dataset keyword must be classified, so no name field skips the name rule."""
    from jobs.recipe.paths.data import DATA_PATH_KEYS, DATASET_NAME_KEYS
    from jobs.recipe.sections.values import DATASET_NUMBER_KEYS
    from jobs.recipe.targets.table import CANONICAL

    common = {*DATA_PATH_KEYS, *DATASET_NAME_KEYS, *DATASET_NUMBER_KEYS}
    for spec in CANONICAL.values():
        if spec.kind == "dataset":
            typed = set(spec.values.model_fields) if spec.values is not None else set()
            known = common | spec.paths | set(spec.names) | typed
            assert spec.params is not None and spec.params <= known, (
                spec.name,
                spec.params - known,
            )


# --- a relative path that exists is a path, not a hub id ----------------------------------


def test_existing_relative_two_part_path_is_checked_against_the_roots(
    validate, recipe, tmp_path, monkeypatch
):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0\n")
    monkeypatch.chdir(tmp_path)  # not a data root: the roots are tmp_path/data only
    recipe["dataset"]["path_or_dataset"] = "etc/passwd"
    assert "outside" in error_at(validate(recipe), "dataset.path_or_dataset").msg
    recipe["model"]["pretrained_model_name_or_path"] = "etc/passwd"
    error_at(validate(recipe), "model.pretrained_model_name_or_path")


def test_etc_passwd_from_the_filesystem_root(validate, recipe, monkeypatch):
    monkeypatch.chdir("/")
    recipe["dataset"]["path_or_dataset"] = "etc/passwd"
    error_at(validate(recipe), "dataset.path_or_dataset")


def test_a_dangling_relative_symlink_is_a_path_not_a_hub_id(
    validate, recipe, tmp_path, monkeypatch
):
    (tmp_path / "org").mkdir()
    os.symlink(tmp_path / "absent", tmp_path / "org" / "name")
    monkeypatch.chdir(tmp_path)
    recipe["dataset"]["path_or_dataset"] = "org/name"
    error_at(validate(recipe), "dataset.path_or_dataset")


def test_hub_rule_agrees_with_the_trainer(tmp_path, monkeypatch):
    from jobs.recipe.paths.roots import names_hub_repo
    from trainer.data.hub import is_hub_dataset

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("x")
    monkeypatch.chdir(tmp_path)
    for value in ("etc/passwd", "org/name", "a/b/c", "name"):
        assert names_hub_repo(value) == is_hub_dataset(value), value
    assert names_hub_repo("org/name") and not names_hub_repo("etc/passwd")


def test_roots_contain_their_subpaths_only_not_siblings_sharing_a_prefix(tmp_path):
    from jobs.recipe.paths.roots import check_path

    (tmp_path / "data").mkdir()
    (tmp_path / "data2").mkdir()
    (tmp_path / "data" / "x").mkdir()
    roots = [tmp_path / "data"]
    assert check_path(str(tmp_path / "data2"), "dataset.path", roots).kind == "invalid"
    assert check_path(str(tmp_path / "data" / "x"), "dataset.path", roots).kind == "local"
    assert check_path(str(tmp_path / "data"), "dataset.path", roots).kind == "local"
    assert check_path(str(tmp_path / "data2"), "dataset.path", [Path("/")]).kind == "local"
    escape = check_path(str(tmp_path / "data" / ".." / "data2"), "dataset.path", roots)
    assert escape.kind == "invalid" and "'..'" in escape.errors[0].msg


def test_a_symlinked_root_contains_what_lies_under_its_target(tmp_path):
    from jobs.recipe.paths.roots import check_path

    (tmp_path / "real" / "set").mkdir(parents=True)
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    assert (
        check_path(str(tmp_path / "linked" / "set"), "dataset.path", [tmp_path / "linked"]).kind
        == "local"
    )


# --- read_bounded: real path inside the roots, a regular file, at most `cap` bytes ---


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return root


def test_read_bounded_reads_a_regular_file_up_to_the_cap(root):
    from jobs.recipe.paths.roots import read_bounded

    (root / "config.json").write_bytes(b"0123456789")
    assert read_bounded(root / "config.json", "model", [root], 10) == (b"0123456789", [])
    data, errors = read_bounded(root / "config.json", "model", [root], 9)
    assert data is None and errors[0].loc == "model"
    assert "10 bytes, over the 9 bytes" in errors[0].msg and "at most 9 bytes" in errors[0].fix


def test_read_bounded_follows_a_link_that_stays_inside_the_roots(root):
    from jobs.recipe.paths.roots import read_bounded

    (root / "blobs").mkdir()
    (root / "blobs" / "f1").write_bytes(b"{}")
    (root / "snapshots" / "abc").mkdir(parents=True)
    (root / "snapshots" / "abc" / "config.json").symlink_to("../../blobs/f1")
    assert read_bounded(root / "snapshots" / "abc" / "config.json", "m", [root], 10) == (b"{}", [])


@pytest.mark.parametrize("how", ["file", "directory", "dotdot"])
def test_read_bounded_refuses_a_link_out_of_the_roots(root, tmp_path, how):
    from jobs.recipe.paths.roots import read_bounded

    (tmp_path / "secret").write_bytes(b"secret")
    target = {"file": tmp_path / "secret", "directory": tmp_path, "dotdot": Path("..")}[how]
    (root / "link").symlink_to(target)
    file = root / "link" if how == "file" else root / "link" / "secret"
    data, errors = read_bounded(file, "model.config", [root], 100)
    assert data is None and errors[0].loc == "model.config"
    assert "leads outside the allowed roots" in errors[0].msg


def test_read_bounded_never_follows_a_link_swapped_in_after_the_check(root, monkeypatch):
    """The file is opened with O_NOFOLLOW: a final link that appears between the real-path
    check and the open is refused, not followed (here: as if `realpath` saw no link)."""
    from jobs.recipe.paths import roots as paths

    (root / "target").write_bytes(b"{}")
    (root / "link").symlink_to("target")
    monkeypatch.setattr(paths.os.path, "realpath", lambda path: os.fspath(path))
    data, errors = paths.read_bounded(root / "link", "model", [root], 100)
    assert data is None and errors[0].msg.startswith(f"cannot read {shown(str(root / 'link'))}")


def test_read_bounded_refuses_a_fifo_without_waiting_for_a_writer(root):
    from jobs.recipe.paths.roots import read_bounded

    os.mkfifo(root / "config.json")
    data, errors = read_bounded(root / "config.json", "model", [root], 100)
    assert data is None and "is not a regular file" in errors[0].msg


def test_read_bounded_refuses_devices_and_directories(root):
    from jobs.recipe.paths.roots import read_bounded

    for file, roots in ((Path("/dev/zero"), [Path("/dev")]), (root, [root])):
        data, errors = read_bounded(file, "model", roots, 100)
        assert data is None and "is not a regular file" in errors[0].msg, errors


def test_read_bounded_reports_a_missing_file_at_its_field(root):
    from jobs.recipe.paths.roots import read_bounded

    data, errors = read_bounded(root / "absent.json", "model.config", [root], 100)
    assert data is None and errors[0].loc == "model.config" and "cannot read" in errors[0].msg


def test_a_root_repointed_between_two_validations_is_followed(settings, recipe, tmp_path):
    """Each validation resolves the roots afresh: once the operator points the root link at
    another directory, a link in it that leads back into the old one is outside."""
    from cli.demo_assets import write_squad_dir
    from jobs.recipe.validation import validate_job

    old, new, root = tmp_path / "old", tmp_path / "new", tmp_path / "root"
    write_squad_dir(old / "squad", n=8)
    new.mkdir()
    for place in (old, new):
        (place / "set").symlink_to(old / "squad")
    root.symlink_to(old)
    settings = settings.model_copy(update={"data_roots": f"{root}:{settings.data_roots}"})
    recipe["dataset"]["path_or_dataset"] = str(root / "set")
    assert validate_job(recipe, settings=settings).valid
    root.unlink()
    root.symlink_to(new)
    result = validate_job(recipe, settings=settings)
    assert "leads outside" in error_at(result, "dataset.path_or_dataset").msg


def test_a_validation_resolves_the_data_roots_once(settings, recipe, data_root, monkeypatch):
    """The model, dataset and config-file checks of one validation share one resolution of
    the data roots (each check resolving them again cost a `stat` per component each)."""
    import os.path

    from jobs.recipe.validation import validate_job

    real, resolved = os.path.realpath, []
    monkeypatch.setattr(os.path, "realpath", lambda p, **k: resolved.append(str(p)) or real(p, **k))
    assert validate_job(recipe, settings=settings).valid
    assert resolved.count(str(data_root)) == 1
