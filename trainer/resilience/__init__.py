"""Below the training loop: what makes a resumed or rolled-back run trustworthy.

`fingerprint` proves a restored state is the one that was saved (parameter, optimizer and
RNG digests, and the loss of a probe batch); `recovery` rolls a diverging run back to its
last checkpoint and skips the rows that made it diverge. Neither imports the loop: the loop
hands them what they need (the forward pass from `trainer.forward`, the run's log).
"""
