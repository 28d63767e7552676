"""Tied input/output embeddings policy: which classes may tie, and who decides.

Every native causal-LM class's registry row says its `TieSupport` (`cls.tie_support()`).
`reject_unsupported_tie_word_embeddings` runs first in each `__init__` and refuses a config
the policy does not allow; `tie_enabled` reads the config flag only under BOTH (TIED_ONLY
and UNTIED_ONLY are authoritative); `reject_tie_word_embeddings_flip` keeps the
checkpoint's saved flag authoritative in `from_pretrained`.
"""

from __future__ import annotations

from typing import Any

from models.registry import TieSupport


class TieWordEmbeddingsError(ValueError):
    """A config whose tie_word_embeddings the class cannot honour."""


def _flag(config: Any) -> bool:
    return bool(getattr(config, "tie_word_embeddings", False))


def reject_unsupported_tie_word_embeddings(cls: type, config: Any) -> None:
    policy = cls.tie_support()
    tied = _flag(config)
    if policy is TieSupport.TIED_ONLY and not tied:
        raise TieWordEmbeddingsError(
            f"{cls.__name__} supports tied embeddings only (TIED_ONLY) but the config has "
            "tie_word_embeddings=false; use a checkpoint saved with tied embeddings"
        )
    if policy is TieSupport.UNTIED_ONLY and tied:
        raise TieWordEmbeddingsError(
            f"{cls.__name__} supports separate lm_head and embeddings only (UNTIED_ONLY) but "
            "the config has tie_word_embeddings=true; set tie_word_embeddings: false"
        )


def tie_enabled(cls: type, config: Any) -> bool:
    policy = cls.tie_support()
    if policy is TieSupport.TIED_ONLY:
        return True
    if policy is TieSupport.UNTIED_ONLY:
        return False
    return _flag(config)


def reject_tie_word_embeddings_flip(
    checkpoint_config: Any, requested: dict[str, Any], model_class_name: str
) -> None:
    """The checkpoint's saved flag wins: refuse a request to flip it in either direction."""
    if "tie_word_embeddings" not in requested:
        return
    saved, wanted = _flag(checkpoint_config), bool(requested["tie_word_embeddings"])
    if saved != wanted:
        raise TieWordEmbeddingsError(
            f"{model_class_name}: the checkpoint was saved with tie_word_embeddings={saved}; "
            f"loading it with tie_word_embeddings={wanted} would change the model. Drop the "
            "override (the checkpoint's flag is authoritative)"
        )
