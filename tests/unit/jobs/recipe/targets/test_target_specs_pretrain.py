"""The pretraining datasets' specs: AutoModel-shaped blocks validate, bad ones are refused
at their field. Blocks follow AutoModel's examples (megatron_pretrain_gpt2*.yaml,
nanogpt_pretrain.yaml, the benchmark configs), with paths under the test data root."""

from __future__ import annotations

import numpy as np
import pytest
from recipe_asserts import error_at
from token_corpora import counting_documents, write_megatron, write_nanogpt_shard

LLM = "nemo_automodel.components.datasets.llm"
MEGATRON = f"{LLM}.megatron_dataset.MegatronPretraining"
NANOGPT = f"{LLM}.nanogpt_dataset.NanogptDataset"
MOCK = f"{LLM}.mock_iterable_dataset.MockIterableDataset"


@pytest.fixture
def corpus(data_root):
    web = write_megatron(data_root / "web" / "processed_text_document", counting_documents(20, 30))
    code = write_megatron(data_root / "code" / "processed_text_document", counting_documents(9, 30))
    (data_root / "mapping_dir").mkdir()
    return web, code


def _errors(result):
    return [str(e) for e in result.errors]


def test_a_megatron_block_validates(validate, recipe, corpus, data_root):
    web, _ = corpus
    recipe["dataset"] = {
        "_target_": MEGATRON,
        "paths": f"{web}.bin",
        "index_mapping_dir": str(data_root / "mapping_dir"),
        "seq_length": 32,
        "split": "0.99, 0.01, 0.00",
        "splits_to_build": "train",
    }
    result = validate(recipe)
    assert result.valid, _errors(result)
    assert result.recipe["dataset"]["_target_"] == MEGATRON


def test_a_weighted_blend_of_bin_files_validates(validate, recipe, corpus):
    web, code = corpus
    recipe["dataset"] = {"_target_": MEGATRON, "paths": [0.7, f"{web}.bin", 0.3, f"{code}.idx"],
                         "seq_length": 32, "split": "99,1,0", "num_train_samples": 64}  # fmt: skip
    assert validate(recipe).valid, _errors(validate(recipe))


def test_automodels_prefix_blend_form_validates(validate, recipe, corpus):
    web, code = corpus
    recipe["dataset"] = {"_target_": MEGATRON, "paths": ["70", str(web), "30", str(code)],
                         "seq_length": 32, "split": "0.99, 0.01, 0"}  # fmt: skip
    assert validate(recipe).valid, _errors(validate(recipe))


def test_automodels_glob_form_validates(validate, recipe, corpus, data_root):
    recipe["dataset"] = {"_target_": MEGATRON, "seq_length": 32,
                         "paths": str(data_root / "web" / "processed_text_document*")}  # fmt: skip
    assert validate(recipe).valid, _errors(validate(recipe))


@pytest.mark.parametrize(
    "paths",
    [["../../etc/x"], [1.0, "../../etc/x"], [0.5, "WEB", 0.5, "/etc/x"]],
)
def test_escaping_megatron_paths_are_refused_at_their_item(validate, recipe, corpus, paths):
    web, _ = corpus
    paths = [f"{web}.bin" if p == "WEB" else p for p in paths]
    recipe["dataset"] = {"_target_": MEGATRON, "paths": paths, "seq_length": 32}
    loc = f"dataset.paths.{len(paths) - 1}"
    assert "allowed roots" in error_at(validate(recipe), loc).msg


def test_an_escaping_split_mapping_and_mapping_dir_are_refused(validate, recipe, corpus):
    web, _ = corpus
    recipe["dataset"] = {"_target_": MEGATRON, "seq_length": 32,
                         "paths": {"train": f"{web}.bin", "validation": ["/etc/passwd"]},
                         "index_mapping_dir": "/tmp/../etc"}  # fmt: skip
    result = validate(recipe)
    error_at(result, "dataset.paths.validation.0")
    error_at(result, "dataset.index_mapping_dir")


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"paths": [0.7, "WEB", 0.3]}, "dataset.paths"),
        ({"split": "train"}, "dataset.split"),
        ({"splits_to_build": "dev"}, "dataset.splits_to_build"),
        ({"splits_to_build": ["train", "validation"]}, "dataset.splits_to_build"),
        ({"micro_batch_size": "4"}, "dataset.micro_batch_size"),
        ({"num_train_samples": 0}, "dataset.num_train_samples"),
        ({"mmap_bin_files": "yes"}, "dataset.mmap_bin_files"),
        ({"dataloader_type": "random"}, "dataset.dataloader_type"),
        ({"seq_length": -1}, "dataset.seq_length"),
        ({"seq_len": 32}, "dataset.seq_len"),
        # a nested tokenizer becomes the recipe's tokenizer section, checked there
        ({"tokenizer": {"_target_": "transformers.AutoTokenizer.from_pretrained"}},
         "tokenizer.pretrained_model_name_or_path"),
    ],
)  # fmt: skip
def test_bad_megatron_keywords_are_refused_at_their_field(validate, recipe, corpus, change, loc):
    web, _ = corpus
    section = {"_target_": MEGATRON, "paths": f"{web}.bin", "seq_length": 32}
    for key, value in change.items():
        section[key] = (
            [f"{web}.bin" if v == "WEB" else v for v in value] if key == "paths" else value
        )
    recipe["dataset"] = section
    error_at(validate(recipe), loc)


def test_a_nanogpt_block_validates_and_folds_seq_len(validate, recipe, data_root):
    shard = write_nanogpt_shard(data_root / "fineweb_train_000001.bin", np.arange(200))
    recipe["dataset"] = {"_target_": NANOGPT, "file_pattern": [str(shard)], "seq_len": 32,
                         "shuffle_files": True, "drop_last": True, "infinite": False}  # fmt: skip
    result = validate(recipe)
    assert result.valid, _errors(result)
    assert (
        result.recipe["dataset"]["seq_length"] == 32 and "seq_len" not in result.recipe["dataset"]
    )


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"file_pattern": ["../../etc/x.bin"]}, "dataset.file_pattern.0"),
        ({"file_pattern": "/etc/*.bin"}, "dataset.file_pattern"),
        ({"align_to_bos": True}, "dataset.align_to_bos"),
        ({"bos_token": -1}, "dataset.bos_token"),
        ({"shuffle_files": 1}, "dataset.shuffle_files"),
        ({"device_mesh": None}, "dataset.device_mesh"),
    ],
)
def test_bad_nanogpt_keywords_are_refused(validate, recipe, data_root, change, loc):
    shard = write_nanogpt_shard(data_root / "s.bin", np.arange(200))
    recipe["dataset"] = {"_target_": NANOGPT, "file_pattern": [str(shard)], "seq_len": 32, **change}
    error_at(validate(recipe), loc)


def test_a_benchmark_mock_block_validates(validate, recipe):
    recipe["dataset"] = {"_target_": MOCK, "seq_len": 64, "num_samples": 1000, "vocab_size": 512}
    result = validate(recipe)
    assert result.valid, _errors(result)
    recipe["dataset"]["batch_size"] = 0
    error_at(validate(recipe), "dataset.batch_size")
    recipe["dataset"]["batch_size"], recipe["dataset"]["num_samples"] = 1, -5
    error_at(validate(recipe), "dataset.num_samples")


def test_our_names_are_the_canonical_specs():
    from jobs.recipe.targets.table import CANONICAL, TARGETS

    for alias, ours in [(MEGATRON, "MegatronPretraining"), (NANOGPT, "NanogptDataset"),
                        (f"{LLM}.NanogptDataset", "NanogptDataset"),
                        (MOCK, "MockIterableDataset")]:  # fmt: skip
        assert TARGETS[alias] is CANONICAL[f"tuneyard.datasets.{ours}"]


def test_specs_match_the_real_signatures():
    import inspect

    from jobs.recipe.targets.allowlist import load_callable
    from jobs.recipe.targets.specs_pretrain import SPECS

    for spec in SPECS:
        accepted = set(inspect.signature(load_callable(spec)).parameters)
        assert spec.params | spec.injected == accepted, spec.name


def test_mock_exclude_token_ids_is_typed(validate, recipe):
    recipe["dataset"] = {"_target_": "tuneyard.datasets.MockIterableDataset", "vocab_size": 512,
                         "seq_len": 32, "exclude_token_ids": [0]}  # fmt: skip
    assert validate(recipe).valid
    recipe["dataset"]["exclude_token_ids"] = ["pad"]
    assert any(e.loc.startswith("dataset.exclude_token_ids") for e in validate(recipe).errors)


@pytest.mark.parametrize(
    ("section", "words"),
    [({"vocab_size": 4096}, "4096 draws token ids"),
     ({}, "1024 (the default) draws token ids")],
)  # fmt: skip
def test_mock_tokens_beyond_the_models_vocabulary_are_refused(validate, recipe, section, words):
    """The test model's vocab_size is 512: ids above it would fail at the embedding lookup."""
    recipe["dataset"] = {"_target_": MOCK, "seq_len": 32, **section}
    error = error_at(validate(recipe), "dataset.vocab_size")
    assert words in error.msg and "its vocab_size is 512" in error.msg
    assert error.fix == "set dataset.vocab_size to at most 512 (the model's vocab_size)"
    recipe["dataset"]["vocab_size"] = 512
    assert validate(recipe).valid


def test_automodels_unpacked_mock_builder_is_the_mock_sentence_dataset(validate, recipe):
    recipe["dataset"] = {"_target_": f"{LLM}.mock.build_unpacked_dataset", "mean_len": 64,
                         "std_len": 0, "vocab_size": 100, "max_sentence_len": 64, "seed": 0}  # fmt: skip
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    from jobs.recipe.targets.table import TARGETS

    assert TARGETS[result.typed.dataset.target].name == "tuneyard.datasets.MockSentenceDataset"
    recipe["dataset"]["std_len"] = -1
    error_at(validate(recipe), "dataset.std_len")
    recipe["dataset"] |= {"std_len": 0, "vocab_size": 1000}
    assert "vocab_size is 512" in error_at(validate(recipe), "dataset.vocab_size").msg
