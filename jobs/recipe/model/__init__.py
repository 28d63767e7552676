"""What validation learns about the model without torch: its config (local or hub cache),
the capabilities its registry row grants, config overrides given as model keywords,
native fallbacks, fused layouts, and the hub names an offline server must hold.
"""
