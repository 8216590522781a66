__version__ = version = "@VERSION@"
__version_tuple__ = version_tuple = tuple(
    int(p) if p.isdigit() else p for p in "@VERSION@".replace("+", ".").split("."))
