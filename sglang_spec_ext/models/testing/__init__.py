"""Tiny random-weight models and adapters the tests build (nothing is downloaded)."""
