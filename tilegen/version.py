"""The tilegen version (its own module so that any module can read it without importing
the package and its lazy re-exports)."""

__version__ = "0.1.0"
