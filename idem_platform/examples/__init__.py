"""User code built on the generated definitions: examples of assets that read idem's tables.

Each module builds a code location of its own: the definitions ``idem.yaml`` generates
(:func:`~idem_platform.defs.definitions.build_definitions`) merged with the example's
assets, which read ``idem/<record_type>`` table assets as Spark DataFrames.
"""
