"""Hydra configs of ``lacuna-unlearn`` (a package so Hydra can find them in an installed wheel).

Importing it (Hydra does, to read the files) registers the methods' dataclass defaults in Hydra's ConfigStore
(:func:`lacuna_unlearn.methods.registry.store_method_configs`), which the files under ``method/`` extend.
"""

from lacuna_unlearn.methods.registry import store_method_configs

store_method_configs()
