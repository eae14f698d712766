"""The eval phase (docs/training.md, "The eval phase"): the records' tools and scorers (no torch), the generation with
the adapter and without it, and `python -m training.evaluation`, the child process the on-box agent runs after the
training phases."""
