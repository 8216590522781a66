"""FlashInfer (toy build)."""

__version__ = "@VERSION@"
