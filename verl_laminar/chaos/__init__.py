"""Chaos on the product: seeded faults injected into ``main_ppo +laminar=enabled`` (``python -m verl_laminar.chaos``,
``chaos.product``), reported from the launches' logs (``chaos.report``)."""
