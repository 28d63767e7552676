"""Sections with rules of their own: optimizer, scheduler, PEFT, packing and dataset values,
knowledge distillation, benchmark, recovery and experiment trackers.
"""
