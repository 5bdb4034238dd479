"""The training system: loop, schedule, checkpoints, logging (see loop.py)."""
