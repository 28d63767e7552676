"""AutoModel's losses, optimizers from optional packages and config loaders: their specs,
aliases and keyword synonyms, merged into the allowlist by `jobs.recipe.targets.table`.

The chunked, fused-linear and Transformer Engine cross entropies are tuneyard's own
(`trainer.chunked_loss`): same loss value, kernels reported as not used. The optimizers of
Transformer Engine, flashoptim and dion are the packages' own classes: a job naming one
*requires* that package (`TargetSpec.requires`), so it runs only on a worker that can import
it. `transformers.AutoConfig.from_pretrained` builds `model.config` for `from_config`.
"""

from __future__ import annotations

from jobs.recipe.targets.spec import TargetSpec, spec

AM_LOSS = "nemo_automodel.components.loss"
_CE_IGNORED = "tuneyard's models return logits; the same cross entropy is computed in chunks"
_LOSSES = [
    spec(
        "tuneyard.loss.ChunkedCrossEntropy",
        "trainer.chunked_loss:ChunkedCrossEntropy",
        "loss",
        ("chunk_len", "compile", "ignore_index", "reduction", "inplace_grad"),
        ignored={
            "compile": "the chunk loop runs eagerly; torch.compile of the loss is not used",
            "inplace_grad": "the logits' gradient always gets its own buffer",
        },
    ),
    spec(
        "tuneyard.loss.FusedLinearCrossEntropy",
        "trainer.chunked_loss:FusedLinearCrossEntropy",
        "loss",
        ("ignore_index", "logit_softcapping", "reduction", "impl"),
        ignored={"impl": _CE_IGNORED},
        always_warn=_CE_IGNORED,
    ),
    spec(
        "tuneyard.loss.TEParallelCrossEntropy",
        "trainer.chunked_loss:TEParallelCrossEntropy",
        "loss",
        ("ignore_index", "reduction"),
        always_warn="the Transformer Engine (Triton) kernel is not used; the same fp32 cross "
        "entropy is computed in chunks",
    ),
]

_ADAM = ("lr", "betas", "eps", "weight_decay")
_OPTIMIZERS = [
    spec(
        "transformer_engine.pytorch.optimizers.FusedAdam",
        "transformer_engine.pytorch.optimizers:FusedAdam",
        "optimizer",
        (
            *_ADAM,
            "amsgrad",
            "bias_correction",
            "adam_w_mode",
            "master_weights",
            "master_weight_dtype",
            "exp_avg_dtype",
            "exp_avg_sq_dtype",
            "capturable",
            "set_grad_none",
            "store_param_remainders",
            "use_decoupled_grad",
        ),
        injected=("params",),
        requires=("transformer_engine",),
    ),
    # The packages' signatures are not known without them; they check their own keywords
    # when the worker that has them builds the optimizer.
    spec(
        "flashoptim.FlashAdamW",
        "flashoptim:FlashAdamW",
        "optimizer",
        None,
        injected=("params",),
        requires=("flashoptim",),
    ),
    *(
        spec(
            f"dion.{name}",
            f"dion:{name}",
            "optimizer",
            None,
            injected=("params",),
            requires=("dion",),
        )
        for name in ("Muon", "NorMuon", "Dion", "Dion2")
    ),
]

_CONFIGS = [
    spec(
        "transformers.AutoConfig.from_pretrained",
        "models.auto:auto_config",
        "config",
        # Besides the path: config attribute overrides (`jobs.recipe.targets.loader_kwargs`).
        ("pretrained_model_name_or_path",),
        required=("pretrained_model_name_or_path",),
        paths=("pretrained_model_name_or_path",),
        overrides=True,
    ),
]

SPECS: list[TargetSpec] = [*_LOSSES, *_OPTIMIZERS, *_CONFIGS]
ALIASES: dict[str, str] = {
    "nemo_automodel._transformers.auto_config.NeMoAutoConfig.from_pretrained": "transformers.AutoConfig.from_pretrained",
    "nemo_automodel.NeMoAutoConfig.from_pretrained": "transformers.AutoConfig.from_pretrained",
    "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam": "transformer_engine.pytorch.optimizers.FusedAdam",
    f"{AM_LOSS}.chunked_ce.ChunkedCrossEntropy": "tuneyard.loss.ChunkedCrossEntropy",
    f"{AM_LOSS}.linear_ce.FusedLinearCrossEntropy": "tuneyard.loss.FusedLinearCrossEntropy",
    f"{AM_LOSS}.te_parallel_ce.TEParallelCrossEntropy": "tuneyard.loss.TEParallelCrossEntropy",
}
SYNONYMS: dict[str, dict[str, str]] = {}
