"""The tokenizer a recipe's `tokenizer:` section names (validation lifts a dataset's own there):
`transformers.AutoTokenizer.from_pretrained` and AutoModel's
`NeMoAutoTokenizer.from_pretrained`, loaded from local files or the hub cache only.

Both read `pretrained_model_name_or_path` with `local_files_only=True` (a worker downloads
nothing a job did not bring), and `trust_remote_code` is what the trainer passes: the grant
the model was given at submit, never the recipe's. A tokenizer without a pad token pads with
EOS. AutoModel's wrapper adds BOS/EOS on every call (`add_bos_token`, `add_eos_token`,
`force_hf`); tuneyard's datasets place BOS before the prompt and EOS after each target
themselves and call the tokenizer without special tokens, so those keywords change nothing
here and the plain transformers tokenizer is returned.
"""

from __future__ import annotations

from typing import Any

from trainer.errors import data_error


def from_pretrained(
    pretrained_model_name_or_path: str,
    *,
    trust_remote_code: bool = False,
    use_fast: bool | None = None,
    revision: str | None = None,
    subfolder: str | None = None,
    model_max_length: int | None = None,
    legacy: bool | None = None,
    padding_side: str | None = None,  # the collator pads on the right
    truncation_side: str | None = None,  # datasets truncate, keeping the target
    add_bos_token: bool | None = None,
    add_eos_token: bool | None = None,
) -> Any:
    """A transformers tokenizer from a local directory or the hub cache."""
    from transformers import AutoTokenizer

    given = dict(
        use_fast=use_fast,
        revision=revision,
        subfolder=subfolder,
        model_max_length=model_max_length,
        legacy=legacy,
    )
    kwargs = {key: value for key, value in given.items() if value is not None}
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            pretrained_model_name_or_path,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
            **kwargs,
        )
    except (OSError, ValueError) as exc:
        raise data_error(
            f"tokenizer: cannot load a tokenizer from {pretrained_model_name_or_path} ({exc}); "
            "set tokenizer.pretrained_model_name_or_path to a local tokenizer dir or a hub "
            "name in the worker's cache"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def nemo_from_pretrained(
    pretrained_model_name_or_path: str,
    *,
    trust_remote_code: bool = False,
    use_fast: bool | None = None,
    revision: str | None = None,
    subfolder: str | None = None,
    model_max_length: int | None = None,
    legacy: bool | None = None,
    padding_side: str | None = None,
    truncation_side: str | None = None,
    add_bos_token: bool | None = None,
    add_eos_token: bool | None = None,
    force_hf: bool = False,  # the plain tokenizer is what tuneyard's datasets want anyway
) -> Any:
    """AutoModel's `NeMoAutoTokenizer.from_pretrained`: the same tokenizer (see the module)."""
    return from_pretrained(
        pretrained_model_name_or_path,
        trust_remote_code=trust_remote_code,
        use_fast=use_fast,
        revision=revision,
        subfolder=subfolder,
        model_max_length=model_max_length,
        legacy=legacy,
    )
