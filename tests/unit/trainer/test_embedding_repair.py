"""Repair of near-zero input-embedding rows (trainer.embedding_repair): which rows count as
damaged, the replacement (output row direction at the healthy rows' RMS norm), healthy rows
untouched, the refusals that leave the weights as they were, tied embeddings and the log."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cli.demo_assets import tiny_llama_config
from jobs.recipe.typed import EmbeddingRowRepair
from models import AutoModelForCausalLM
from trainer.embedding_repair import repair_embedding_rows, repair_rows
from trainer.errors import TrainerError

INPUT = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0],
         [1.0e-8, 0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 4.0]]  # fmt: skip
OUTPUT = [[1.0, 1.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 1.0, 0.0],
          [4.0, 3.0, 2.0, 1.0], [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]  # fmt: skip


class TinyLM(nn.Module):
    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(6, 4)
        self.lm_head = nn.Linear(4, 6, bias=False)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(torch.tensor(INPUT))
            self.lm_head.weight.copy_(torch.tensor(OUTPUT))
        if tied:
            self.lm_head.weight = self.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head


def test_damaged_rows_take_the_output_direction_at_the_healthy_rms_norm(capsys):
    model = TinyLM()
    report = repair_embedding_rows(model, EmbeddingRowRepair(min_norm=1.0e-4, max_rows=256), True)
    target = math.sqrt((1 + 4 + 9 + 16) / 4)  # healthy rows 0, 2, 4, 5 have norms 1..4
    assert report.row_ids == (1, 3) and report.min_norm_before == 0.0
    assert report.target_norm == pytest.approx(target)
    weight = model.embed_tokens.weight.detach()
    expected = torch.tensor([OUTPUT[1], OUTPUT[3]]) * target / math.sqrt(30.0)  # both |.|^2 = 30
    torch.testing.assert_close(weight[[1, 3]], expected)
    assert torch.equal(weight[[0, 2, 4, 5]], torch.tensor(INPUT)[[0, 2, 4, 5]])
    assert torch.equal(model.lm_head.weight.detach(), torch.tensor(OUTPUT))
    line = capsys.readouterr().out
    assert "repaired 2 input embedding row(s) in embed_tokens.weight from lm_head.weight" in line
    assert "ids=[1, 3]" in line


def test_the_threshold_is_inclusive_and_non_finite_rows_count():
    model = TinyLM()
    with torch.no_grad():
        model.embed_tokens.weight[0, 0] = float("nan")
    assert repair_rows(model, min_norm=1.0, max_rows=256).row_ids == (0, 1, 3)  # |row 0| = 1
    assert torch.isfinite(model.embed_tokens.weight).all()


def test_default_threshold_leaves_small_healthy_rows():
    model = TinyLM()
    assert repair_rows(model, min_norm=1.0e-6, max_rows=256).row_ids == (1, 3)
    assert repair_rows(model, min_norm=1.0e-9, max_rows=256).row_ids == ()  # 1e-8 row: healthy


def test_healthy_embeddings_are_left_alone_and_logged(capsys):
    model = TinyLM()
    repair_rows(model, min_norm=1.0e-4, max_rows=256)
    before = model.embed_tokens.weight.detach().clone()
    report = repair_embedding_rows(model, EmbeddingRowRepair(1.0e-4, 256), True)
    assert report.row_ids == () and report.target_norm is None
    assert torch.equal(model.embed_tokens.weight.detach(), before)
    assert "repaired 0 input embedding rows" in capsys.readouterr().out


def test_no_section_does_nothing_and_other_ranks_stay_quiet(capsys):
    model = TinyLM()
    assert repair_embedding_rows(model, None, True) is None
    assert repair_embedding_rows(model, EmbeddingRowRepair(1.0e-4, 256), False).row_ids == (1, 3)
    assert capsys.readouterr().out == ""


def test_bfloat16_weights_reach_the_target_norm():
    model = TinyLM().to(torch.bfloat16)
    report = repair_rows(model, min_norm=1.0e-4, max_rows=256)
    norms = model.embed_tokens.weight[[1, 3]].float().norm(dim=1)
    torch.testing.assert_close(norms, torch.full((2,), report.target_norm), rtol=5e-3, atol=5e-3)


def _refused(model: nn.Module, match: str, **options) -> TrainerError:
    before = model.embed_tokens.weight.detach().clone()
    with pytest.raises(TrainerError, match=match) as caught:
        repair_rows(model, **{"min_norm": 1.0e-4, "max_rows": 256, **options})
    assert torch.equal(model.embed_tokens.weight.detach(), before)  # nothing changed
    return caught.value


def test_more_rows_than_max_rows_stop_before_any_change():
    error = _refused(TinyLM(), "refusing to repair 2 input embedding rows", max_rows=1)
    assert "max_rows" in error.fix


def test_a_damaged_output_row_is_refused():
    model = TinyLM()
    with torch.no_grad():
        model.lm_head.weight[3].zero_()
    _refused(model, r"output rows are also damaged: \[3\]")


def test_tied_embeddings_repair_nothing_when_healthy_and_refuse_damaged_rows():
    model = TinyLM(tied=True)
    _refused(model, r"tied to the input embedding\): \[1, 3\]")
    with torch.no_grad():
        model.embed_tokens.weight[[1, 3]] = 1.0
    assert repair_rows(model, min_norm=1.0e-4, max_rows=256).row_ids == ()


def test_a_model_without_output_embedding_is_refused():
    model = TinyLM()
    model.lm_head = None
    model.get_output_embeddings = lambda: None
    _refused(model, "no output embedding")


def test_a_native_model_is_repaired_by_parameter_name():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(vocab_size=64))
    with torch.no_grad():
        model.model.embed_tokens.weight[[5, 9]] = 0.0
    report = repair_rows(model, min_norm=1.0e-6, max_rows=256)
    # row 0 too: the padding row is initialised to zeros, and AutoModel repairs it as well
    assert report.input_name == "model.embed_tokens.weight" and report.row_ids == (0, 5, 9)
    assert report.output_name == "lm_head.weight"
    assert (model.model.embed_tokens.weight[[0, 5, 9]].norm(dim=1) > 0).all()


class Unusual(nn.Module):
    """A model with its own embedding shapes, found by parameter name only."""

    def __init__(self, vocab: int = 2, out_vocab: int = 2, dtype=torch.float32) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, 2, dtype=dtype)
        self.lm_head = nn.Linear(2, out_vocab, bias=False, dtype=dtype)


def test_no_input_embedding_is_refused():
    with pytest.raises(TrainerError, match="no input embedding matrix"):
        repair_rows(nn.Linear(2, 2), min_norm=1.0e-4, max_rows=256)


def test_output_rows_that_do_not_match_are_refused():
    model = Unusual(vocab=2, out_vocab=3)
    with torch.no_grad():
        model.embed_tokens.weight[1] = 0.0
    with pytest.raises(TrainerError, match="rows cannot be matched"):
        repair_rows(model, min_norm=1.0e-4, max_rows=256)


def test_an_embedding_without_healthy_rows_is_refused():
    model = Unusual()
    with torch.no_grad():
        model.embed_tokens.weight.zero_()
        model.lm_head.weight.fill_(1.0)
    with pytest.raises(TrainerError, match="no healthy rows"):
        repair_rows(model, min_norm=1.0e-4, max_rows=256)
    assert torch.equal(model.embed_tokens.weight, torch.zeros(2, 2))


def test_a_row_the_dtype_cannot_hold_is_still_damaged_and_refused():
    model = Unusual(dtype=torch.float16)
    with torch.no_grad():  # the healthy RMS norm, 84852, overflows float16
        model.embed_tokens.weight.copy_(torch.tensor([[60000.0, 60000.0], [0.0, 0.0]]))
        model.lm_head.weight.copy_(torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    with pytest.raises(TrainerError, match=r"rows \[1\] are still damaged after repair"):
        repair_rows(model, min_norm=1.0e-4, max_rows=256)
