"""Serving glue: spec class, server arguments, request guard, metrics, corpora, snapshots, LoRA."""
