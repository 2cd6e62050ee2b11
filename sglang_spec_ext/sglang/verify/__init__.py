"""Verify widths: per-width buffers and graphs, verify rows, memory checks and KV reserve."""
