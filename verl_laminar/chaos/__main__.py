"""``python -m verl_laminar.chaos``: chaos on the product (``chaos.product``: faults injected into
``main_ppo +laminar=enabled``)."""

from verl_laminar.chaos.product import main

if __name__ == "__main__":
    raise SystemExit(main())
