"""Chaos benchmarks: on the product (``python -m verl_laminar.chaos``, faults injected into ``main_ppo
+laminar=enabled``) and on the side runtime (``python -m verl_laminar.chaos.runtime``)."""
