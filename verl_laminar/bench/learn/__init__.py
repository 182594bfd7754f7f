"""Time to reward: verl's sync and one-step-off trainers and Laminar trained on one task under one wall clock.

``python -m verl_laminar.bench.learn`` (``__main__``); the modes, commands, marks and targets in ``plan``, the
clock in ``clock``, the prompt order in ``prompts``, curves and times to target in ``summary``, the JSON in
``result``, the runs in ``launch`` and ``run``, the held-out evaluation in ``heldout``, the pictures in ``plots``.
How to run it and read its result: docs/learn.md.
"""
