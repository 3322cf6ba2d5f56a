"""metarl: train a trainer agent by RL to write RL training jobs for small models."""

__version__ = "0.1.0"
