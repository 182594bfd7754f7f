"""verl_laminar: Laminar asynchronous RL post-training as a plugin suite for verl 0.9.1."""

__version__ = "0.1.0"
