"""Hydra search-path plugin: makes ``+laminar=enabled`` resolve in ``python -m verl.trainer.main_ppo``.

verl's primary config (``ppo_trainer.yaml``) declares no ``hydra.searchpath``, so the only way to add our config
group without forking verl's entry point is a ``SearchPathPlugin``. Hydra discovers it by importing every module
under the ``hydra_plugins`` namespace package, in every Hydra application of the environment: this module must
stay cheap and import nothing heavy (no torch, ray or verl), and ``hydra_plugins/`` must never get an
``__init__.py`` (it would shadow every other package's plugins).
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "verl-laminar"
SEARCH_PATH = "pkg://verl_laminar.config"


class VerlLaminarSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # Appended, not prepended: verl's own groups keep precedence; ours only adds the ``laminar`` group.
        search_path.append(provider=PROVIDER, path=SEARCH_PATH)
