"""The common dense parallel plan: FSDP units and the tensor-parallel plan of a Llama-style stack.

`ParallelPlan` is what a family hands the trainer for sharding, and its defaults are the
plan every dense family uses (`DENSE_PLAN`): the FSDP (and activation-checkpoint) units are
the decoder layers (`decoder_layer_list`), and the DTensor plan (`tp_plan`, applied with
`torch.distributed.tensor.parallel.parallelize_module`) shards the attention and MLP
projections, plus the embeddings, norms and lm_head under sequence parallelism. A dense
stack has no experts, so it refuses expert parallelism, and it refuses tensor parallelism
for attention with per-head q/k norms, whose weight gradients it would leave partial. A
family whose sharding differs subclasses `ParallelPlan` in its own `parallelize.py` and
overrides only what differs (Qwen3 shards its q/k norms; Qwen3-MoE adds expert
parallelism). The plan works for the native classes and for the
Hugging Face Llama-style classes (Llama, Qwen2, Qwen3, Mistral), because both keep the same
module tree: `model.layers[i].self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`,
`input_layernorm`, `post_attention_layernorm`, `model.embed_tokens`, `model.norm`,
`lm_head`. Attention reshapes projections with `-1` heads, so colwise-sharded q/k/v give
each rank its local heads. A LoRA-wrapped projection (PEFT applied before sharding) is
sharded piece by piece (`_lora_pieces`): its `base_layer` as the plain projection would be,
and its adapters so that the low-rank path computes the same layout as the base output.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from models.common.wrappers import unwrap_model

_ATTN_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _layers_prefix(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The dotted name and ModuleList of the decoder layers, e.g. ("model.layers", ...)."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        is_layers = isinstance(module, nn.ModuleList) and name.split(".")[-1] == "layers"
        if is_layers and (best is None or len(name) < len(best[0])):
            best = (name, module)
    return best


def _linear(module: nn.Module | None) -> nn.Linear | None:
    """The projection's linear: itself, or the `base_layer` of a LoRA-wrapped one."""
    module = getattr(module, "base_layer", module)
    return module if isinstance(module, nn.Linear) else None


def _layer_is_llama_style(layer: nn.Module) -> bool:
    attn = getattr(layer, "self_attn", None)
    mlp = getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return False
    if not all(_linear(getattr(attn, p, None)) is not None for p in _ATTN_PROJECTIONS):
        return False
    return all(_linear(getattr(mlp, p, None)) is not None for p in _MLP_PROJECTIONS)


def _lora_wrapped(layer: nn.Module) -> frozenset[str]:
    """The projections of one decoder layer that LoRA wraps ("self_attn.q_proj", ...)."""
    names = [f"self_attn.{p}" for p in _ATTN_PROJECTIONS] + [f"mlp.{p}" for p in _MLP_PROJECTIONS]
    return frozenset(n for n in names if hasattr(layer.get_submodule(n), "base_layer"))


def _lora_refusal(layers: nn.ModuleList) -> str | None:
    """Why the LoRA adapters of these layers cannot follow the plan (None when they can):
    one plan key covers every layer, so all layers must wrap the same projections, and the
    plan shards plain LoRA only (a DoRA magnitude or a second adapter has no placement).
    LoRA elsewhere (lm_head) stays whole with its module unless sequence parallelism
    shards that module (`lora_on_sequence_parallel_ends`)."""
    wrapped = {_lora_wrapped(layer) for layer in layers}
    if len(wrapped) > 1:
        return "LoRA wraps different projections in different decoder layers"
    for module in layers.modules():
        if hasattr(module, "lora_A") and (
            set(module.lora_A) != {"default"} or getattr(module, "lora_variant", None)
        ):
            return "the plan shards one plain LoRA adapter per projection (no DoRA)"
    return None


def lora_on_sequence_parallel_ends(model: nn.Module) -> list[str]:
    """The LoRA-wrapped embedding or lm_head, which sequence parallelism shards as plain
    modules (`_io_plan`): the adapters there have no placement."""
    ends = ("embed_tokens", "lm_head")
    return [
        name
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and name.rsplit(".", 1)[-1] in ends
    ]


def _head_counts(model: nn.Module) -> tuple[int, int]:
    config = getattr(unwrap_model(model), "config", None)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return heads, kv_heads


def _root_prefix(model: nn.Module, inner: nn.Module) -> str:
    """Dotted path from `model` down to the unwrapped causal LM ('' when they are the same)."""
    if inner is model:
        return ""
    for name, module in model.named_modules():
        if module is inner:
            return name + "." if name else ""
    return ""


def _embeddings_tied(model: nn.Module) -> bool:
    head = getattr(model, "lm_head", None)
    get_embed = getattr(model, "get_input_embeddings", None)
    embed = get_embed() if callable(get_embed) else None
    return head is not None and embed is not None and head.weight is embed.weight


def _io_plan(root: str, base: str, tied: bool) -> dict[str, Any]:
    """Embedding, final norm and lm_head when activations between blocks are sequence-sharded.

    Tied embeddings stay replicated (only their output is resharded) so the alias holds;
    untied ones are rowwise and the lm_head colwise, gathering the logits.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {}
    if tied:
        plan[f"{base}embed_tokens"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=False
        )
        plan[f"{root}lm_head"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
    else:
        plan[f"{base}embed_tokens"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        )
        plan[f"{root}lm_head"] = ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True
        )
    plan[f"{base}norm"] = SequenceParallel(use_local_output=False)
    return plan


def _layer_plan(layer: str, sequence_parallel: bool) -> dict[str, Any]:
    """One decoder layer: q/k/v and gate/up colwise, o and down rowwise.

    Under sequence parallelism the norms run as `SequenceParallel`, attention and MLP gather
    their sequence-sharded input first, and o/down return sequence shards.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    def rowwise() -> RowwiseParallel:
        if sequence_parallel:
            return RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
        return RowwiseParallel()

    plan: dict[str, Any] = {}
    if sequence_parallel:
        plan[f"{layer}.input_layernorm"] = SequenceParallel(use_local_output=False)
        plan[f"{layer}.post_attention_layernorm"] = SequenceParallel(use_local_output=False)
        plan[f"{layer}.self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
            use_local_output=True,
        )
    for name in ("q_proj", "k_proj", "v_proj"):
        plan[f"{layer}.self_attn.{name}"] = ColwiseParallel()
    plan[f"{layer}.self_attn.o_proj"] = rowwise()
    if sequence_parallel:
        plan[f"{layer}.mlp"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
    plan[f"{layer}.mlp.gate_proj"] = ColwiseParallel()
    plan[f"{layer}.mlp.up_proj"] = ColwiseParallel()
    plan[f"{layer}.mlp.down_proj"] = rowwise()
    return plan


def _replicated_linear(input_layout: Any, use_local_output: bool) -> Any:
    """A `ParallelStyle` that keeps a linear's weight whole on every tp rank (a Replicate
    DTensor, so FSDP2 and the optimizer see it like the sharded weights) and passes its
    input layout through: the LoRA factor that sits beside a sharded one."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel.style import ParallelStyle

    def replicate(name: str, module: nn.Module, mesh: Any) -> None:
        for key, param in list(module.named_parameters(recurse=False)):
            whole = distribute_tensor(param, mesh, [Replicate()])
            module.register_parameter(key, nn.Parameter(whole, param.requires_grad))

    def prepare_input(module: nn.Module, inputs: tuple, mesh: Any) -> tuple:
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, (input_layout,), run_check=False)
        return (x, *inputs[1:])

    def prepare_output(module: nn.Module, output: Any, mesh: Any) -> Any:
        return output.to_local() if use_local_output else output

    class ReplicatedLinear(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            return distribute_module(module, device_mesh, replicate, prepare_input, prepare_output)

    return ReplicatedLinear()


def _lora_pieces(key: str, colwise: bool, sequence_parallel: bool) -> dict[str, Any]:
    """The plan for a LoRA-wrapped projection at `key`: the base linear as the plain one,
    and `lora_B(lora_A(x))` laid out as the base output. Colwise (output features sharded):
    lora_A whole, lora_B colwise, so each rank computes its output shard; the gradient of
    lora_A's output is summed over the ranks by lora_B's input, as the base input's is.
    Rowwise (input features sharded): lora_A rowwise, its partial sums reduced as the base's
    are (to whole activations, or to sequence shards under sequence parallelism), then
    lora_B whole on that layout."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    a, b = f"{key}.lora_A.default", f"{key}.lora_B.default"
    if colwise:
        return {
            f"{key}.base_layer": ColwiseParallel(),
            a: _replicated_linear(Replicate(), use_local_output=True),
            b: ColwiseParallel(),
        }
    if sequence_parallel:
        return {
            f"{key}.base_layer": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            a: RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            b: _replicated_linear(Shard(1), use_local_output=False),
        }
    return {
        f"{key}.base_layer": RowwiseParallel(),
        a: RowwiseParallel(),
        b: _replicated_linear(Replicate(), use_local_output=True),
    }


def _with_lora(
    plan: dict[str, Any], layer: str, wrapped: frozenset[str], sequence_parallel: bool
) -> dict[str, Any]:
    """`plan` with each LoRA-wrapped projection's entry replaced by its pieces."""
    out = dict(plan)
    for name in sorted(wrapped):
        key = f"{layer}.{name}"
        del out[key]
        colwise = name.rsplit(".", 1)[-1] not in ("o_proj", "down_proj")
        out.update(_lora_pieces(key, colwise, sequence_parallel))
    return out


class ParallelPlan:
    """The common dense plan; a family's `parallelize.py` subclasses it where it differs."""

    # Per-head q/k norms see only the local heads under tensor parallelism, so their weight
    # gradients are partial sums; a plan that does not reduce them must refuse TP.
    shards_qk_norm: ClassVar[bool] = False

    def decoder_layer_list(self, model: nn.Module) -> nn.ModuleList:
        """The ModuleList of repeated blocks: one FSDP unit and activation-checkpoint unit each."""
        found = _layers_prefix(model)
        if found is None:
            raise ValueError(
                f"{type(model).__name__} has no `layers` ModuleList to shard per layer"
            )
        return found[1]

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """The modules `fully_shard` wraps one by one before the root."""
        return list(self.decoder_layer_list(model))

    def layer_pattern(self, model: nn.Module) -> str:
        """The plan key matching every decoder layer, relative to `model` ("model.layers.*")."""
        inner = unwrap_model(model)
        found = _layers_prefix(inner)
        if found is None:
            raise ValueError(f"{type(inner).__name__} has no decoder `layers` list")
        return f"{_root_prefix(model, inner)}{found[0]}.*"

    def tp_unsupported_reason(self, model: nn.Module, tp_size: int | None = None) -> str | None:
        """Why the plan cannot shard this model (None when it can)."""
        inner = unwrap_model(model)
        found = _layers_prefix(inner)
        if found is None:
            return f"{type(model).__name__} has no decoder `layers` list"
        attn = getattr(found[1][0], "self_attn", None) if len(found[1]) else None
        if not all(_layer_is_llama_style(layer) for layer in found[1]):
            return (
                f"{type(inner).__name__} layers are not Llama-style "
                "(self_attn.q/k/v/o_proj + mlp.gate/up/down_proj as nn.Linear)"
            )
        lora = _lora_refusal(found[1])
        if lora:
            return lora
        if not self.shards_qk_norm and getattr(attn, "q_norm", None) is not None:
            return (
                f"{type(inner).__name__} attention has per-head q/k norms, which this "
                "parallel plan does not shard"
            )
        heads, kv_heads = _head_counts(model)
        if tp_size and (heads % tp_size or kv_heads % tp_size):
            return (
                f"attention heads ({heads}) and key/value heads ({kv_heads}) must be divisible "
                f"by tp_size {tp_size}"
            )
        return None

    def tp_plan(self, model: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
        """The DTensor plan, keyed by module names relative to `model` (wildcards per layer).

        Without sequence parallelism only attention and MLP projections are sharded; the
        embeddings, norms and lm_head stay replicated (FSDP still shards them). With it,
        activations between blocks are sharded on the sequence dimension.
        """
        reason = self.tp_unsupported_reason(model)
        if reason:
            raise ValueError(f"tensor parallelism unavailable: {reason}")
        inner = unwrap_model(model)
        prefix = _layers_prefix(inner)[0]
        root = _root_prefix(model, inner)
        layer = self.layer_pattern(model)
        layers = _layers_prefix(inner)[1]
        wrapped = _lora_wrapped(layers[0]) if len(layers) else frozenset()
        layer_plan = _with_lora(
            _layer_plan(layer, sequence_parallel), layer, wrapped, sequence_parallel
        )
        if not sequence_parallel:
            return layer_plan
        base = root + prefix.rsplit(".", 1)[0] + "." if "." in prefix else root
        return {**_io_plan(root, base, _embeddings_tied(inner)), **layer_plan}

    def ep_unsupported_reason(self, model: nn.Module, ep_size: int) -> str | None:
        """Why expert parallelism over `ep_size` ranks cannot apply (a dense stack: always)."""
        return f"{type(unwrap_model(model)).__name__} has no grouped experts to spread over ranks"

    def apply_expert_parallel(self, model: nn.Module, ep_mesh: Any) -> list[nn.Parameter]:
        """Spread the experts over the 1-D `ep_mesh`; returns the (DTensor) expert parameters."""
        reason = self.ep_unsupported_reason(model, ep_mesh.size())
        raise ValueError(f"expert parallelism unavailable: {reason}")


DENSE_PLAN = ParallelPlan()


class QKNormPlanMixin:
    """For families that normalise each head of q and k (one `head_dim` weight shared by
    all heads) on a (batch, seq, heads, head_dim) view between the projection and RoPE.

    With q/k_proj colwise-sharded a rank holds only its local heads there, so a plain
    replicated norm would compute the right outputs but only its own heads' share of the
    weight gradient. The norms therefore run as `SequenceParallel` over the heads dimension:
    the weight is a replicated DTensor and autograd sums its gradient over the tp ranks.
    Put it before the family's base plan: `class Plan(QKNormPlanMixin, BasePlan)`.
    """

    shards_qk_norm: ClassVar[bool] = True
    heads_dim: ClassVar[int] = 2

    def tp_plan(self, model: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
        from torch.distributed.tensor.parallel import SequenceParallel

        plan = super().tp_plan(model, sequence_parallel)  # type: ignore[misc]
        layer = self.layer_pattern(model)  # type: ignore[attr-defined]
        for name in ("q_norm", "k_norm"):
            plan[f"{layer}.self_attn.{name}"] = SequenceParallel(
                sequence_dim=self.heads_dim, use_local_output=True
            )
        return plan
