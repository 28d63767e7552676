"""The `recovery:` section: what the trainer does when the loss diverges (opt-in).

Off by default: a non-finite loss fails the run at that step (`NAN_LOSS`). With
`on_nan: rollback` a non-finite loss, and with `on_spike: {factor, window}` a loss above
`factor` times the median of the last `window` finite losses, rolls the run back to its
LATEST checkpoint (or its start when none exists yet), skips the offending step's rows,
scales the learning rate by `lr_scale` and goes on; after `max_retries` rollbacks in one
attempt the next divergence fails the run naming the rows. The trainer reads the typed
`jobs.recipe.typed.Recovery` built from this section and re-derives nothing.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ON_NAN = ("fail", "rollback")


class SpikeRuleSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # a spike is a loss above factor x the moving median; 1 or less would flag every step
    factor: Annotated[float, Field(gt=1.0, le=1000.0)]
    window: Annotated[int, Field(ge=3, le=10_000)] = 50


class RecoverySection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    on_nan: Literal["fail", "rollback"] = "fail"
    on_spike: SpikeRuleSection | None = None
    max_retries: Annotated[int, Field(ge=1, le=100)] = 3
    lr_scale: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
