"""A megatron_fsdp recipe trains on 2 gloo ranks as FSDP2 (`jobs.recipe.topology.megatron_fsdp`).

The AutoModel spelling (`distributed_config: {_target_: ...MegatronFSDPConfig}`, with
zero_dp_strategy 2 and options that tune only Megatron-FSDP) and the same recipe with
`strategy: fsdp2` run on a tiny from_config Llama: the first builds FSDP2's mesh, and its
losses and gradient norms equal the second's (the same sharded training; only when
parameters are re-gathered differs, which changes no number).
"""

from __future__ import annotations

import pytest
from trainer_harness import Assets, RunResult, base_recipe, launch

pytestmark = pytest.mark.slow

MAX_STEPS = 4
MEGATRON_FSDP = {
    "_target_": "nemo_automodel.components.distributed.config.MegatronFSDPConfig",
    "zero_dp_strategy": 2,
    "overlap_grad_reduce": False,
    "nccl_ub": True,
}


def tiny_recipe(assets: Assets, **sections) -> dict:
    recipe = base_recipe(
        assets,
        step_scheduler={"max_steps": MAX_STEPS, "val_check_interval": None, "checkpoint_interval": None},
        **sections,
    )  # fmt: skip
    recipe["model"] = {
        "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config",
        "config": str(assets.model),
        "dtype": "float32",
        "attention_dropout": 0.0,
    }
    recipe.pop("validation_dataset")
    return recipe


@pytest.fixture(scope="module")
def megatron_run(assets: Assets) -> RunResult:
    recipe = tiny_recipe(assets, distributed_config=MEGATRON_FSDP)
    recipe["distributed"] = {"dp_size": "none"}
    return launch(assets, "megatron-fsdp", recipe, nproc=2)


@pytest.fixture(scope="module")
def fsdp2_run(assets: Assets) -> RunResult:
    return launch(assets, "megatron-fsdp-as-fsdp2", tiny_recipe(assets, distributed={"strategy": "fsdp2"}), nproc=2)  # fmt: skip


def test_megatron_fsdp_trains_on_fsdp2s_mesh(megatron_run: RunResult) -> None:
    assert megatron_run.returncode == 0, megatron_run.output[-3000:]
    started = megatron_run.events()[0]
    assert started["event"] == "started" and started["dp_size"] == 2
    assert started["mesh_shape"] == {"dp_shard": 2, "tp": 1}
    assert len(megatron_run.records("train")) == MAX_STEPS


def test_megatron_fsdp_losses_equal_fsdp2s(megatron_run: RunResult, fsdp2_run: RunResult) -> None:
    assert fsdp2_run.returncode == 0, fsdp2_run.output[-3000:]
    got, want = megatron_run.records("train"), fsdp2_run.records("train")
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, MAX_STEPS + 1))
    for mine, theirs in zip(got, want, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-6), mine["step"]
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-6), mine["step"]
