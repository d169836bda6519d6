"""Training engines: one per backend, all behind ``engines.base.Engine``."""
