"""The reaper: its rules as pure decisions over plain records (`policy`), and the pass that reads the instances,
claims the ones to act on and hands them to the workers (`sweep`)."""
