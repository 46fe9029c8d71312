"""The ``servesim`` command line: one module per sub-command, dispatched from ``main``."""
