"""The mixture-of-experts pieces every MoE family shares: the fp32 top-k router, the grouped
routed experts and the sparse block that joins them (`layers`), the Switch load-balancing
loss and the mixin that adds it to a model's loss (`load_balancing`), expert parallelism
over a 1-D `ep` mesh (`expert_parallel`) and the plan mixin that applies it
(`parallelize`), and the mapping between per-expert checkpoint tensors and the grouped
layout (`state_dict_adapter`). A family folder keeps only what differs: its config field
names, routing details, checkpoint key names.
"""
