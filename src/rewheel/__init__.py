"""rewheel: upgrade a service's Python environment and keep the upgrade only once it is proven."""

__version__ = "0.1.0"
