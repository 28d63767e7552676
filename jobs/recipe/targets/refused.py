"""Callables AutoModel's recipes name that tuneyard refuses on purpose: why, and the fix.

`resolve_target` answers any name off the allowlist as refused; for these it says what
the callable does in AutoModel and what to use instead, so a migrating user is not left
with a did-you-mean.
"""

from __future__ import annotations

_LLM = "nemo_automodel.components.datasets.llm"

# dotted name -> (what it does and why tuneyard does not run it, the fix)
REFUSED_TARGETS: dict[str, tuple[str, str]] = {
    f"{_LLM}.mock_prefix_tree.build_mock_rollout_dataset": (
        "it builds rollout groups for the prefix-tree collater, which tuneyard does not run",
        "use tuneyard.datasets.MockIterableDataset for synthetic tokens",
    ),
}
