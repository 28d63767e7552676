"""Worker for test_gpt_oss_expert_parallel: `_ep_worker`'s checks on a tiny gpt-oss.

`python _gpt_oss_worker.py RANK WORLD PORT OUT CASE...` (through `gloo_cases.run_cases`).
`hooks`: `models.hooks.apply_expert_parallel` alone, 8 expert tensors (gate_up, down and
their biases in 2 layers), 2 of 4 experts per rank; `trainer`: `trainer.parallelize` with
ep_size 2 (experts plus FSDP2 on the rest). Both compare logits, losses, every gradient
(sinks, router bias and expert biases included) and, for the trainer, the clipped gradient
norm with the unsharded model on both ranks' batches.
"""

from __future__ import annotations

from _ep_worker import check_hooks, check_trainer
from gloo_cases import run_cases
from gpt_oss_tiny import seeded_hf_model, tiny_config


def build_pair():
    """The reference and the model to shard: the same seeded weights, native class."""
    from models import AutoModelForCausalLM

    hf = seeded_hf_model(tiny_config(vocab_size=512))  # `_ep_worker` draws ids below 512
    reference = AutoModelForCausalLM.from_config(hf.config)
    reference.load_state_dict(reference.state_dict_adapter().from_hf(hf.state_dict(), hf.config))
    ep_model = AutoModelForCausalLM.from_config(hf.config)
    ep_model.load_state_dict(reference.state_dict())
    return reference, ep_model


def run_case(case: str) -> None:
    if case == "hooks":
        check_hooks(build_pair, expert_tensors=8)
    else:
        check_trainer(build_pair)


if __name__ == "__main__":
    run_cases(run_case)
