"""Callables AutoModel's recipes name that tuneyard refuses on purpose: why, and the fix.

`resolve_target` answers any name off the allowlist as refused; for these it says what
the callable does in AutoModel and what to use instead, so a migrating user is not left
with a did-you-mean.
"""

from __future__ import annotations

_LLM = "nemo_automodel.components.datasets.llm"
_CHAT = f"{_LLM}.chat_dataset.ChatDataset"

# dotted name -> (what it does and why tuneyard does not run it, the fix)
REFUSED_TARGETS: dict[str, tuple[str, str]] = {
    f"{_LLM}.agent_chat.make_agent_chat_dataset": (
        "AutoModel's agent-trace builder converts tool-use traces (ShareGPT "
        "function_call/observation turns, session event streams) into chat messages with its "
        "own filters and history trimming; tuneyard reads no such trace formats",
        "convert the traces to OpenAI `messages` rows (assistant `tool_calls`, `role: tool` "
        f"results, a `tools` list) and use {_CHAT}",
    ),
    f"{_LLM}.xlam.make_xlam_dataset": (
        "it turns xLAM rows (query, and tools and answers as JSON text) into a user turn and "
        "an assistant tool call; tuneyard has no xLAM reader",
        "write each row as OpenAI `messages` ({role: user, content: <query>}, {role: "
        "assistant, tool_calls: [...]}) with a `tools` list, and use " + _CHAT,
    ),
    f"{_LLM}.mock_prefix_tree.build_mock_rollout_dataset": (
        "it builds rollout groups for the prefix-tree collater, which tuneyard does not run",
        "use tuneyard.datasets.MockIterableDataset for synthetic tokens",
    ),
}
