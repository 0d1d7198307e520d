"""graphopt's version, in a module of its own: the report and the CLI read it without
importing the package's front door (graphopt/__init__.py), which imports them."""

__version__ = "0.1.0"  # keep equal to pyproject.toml's version
