"""Laminar's trainer (``trainer.v1.trainer_mode=laminar``); import ``laminar_trainer`` to register it."""
