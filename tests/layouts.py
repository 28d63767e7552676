"""The validated layout (`jobs.recipe.typed.Topology`) of a `distributed:` section, for tests
that build a mesh or parallelize a model without a whole recipe. `tests/` is on `sys.path`."""

from __future__ import annotations

from typing import Any

from jobs.recipe.topology.section import setup_from_section
from jobs.recipe.typed import Topology, build_topology
from jobs.recipe.validation import Resources


def layout(distributed: dict[str, Any], world_size: int, accelerator: str = "cpu") -> Topology:
    setup, errors = setup_from_section(dict(distributed), world_size)
    assert setup is not None and not errors, errors
    resources = Resources(nproc_per_node=world_size, accelerator=accelerator)
    return build_topology(setup.to_dict(), setup.mesh_shape, resources)
