"""The speculative workers the host builds: SUFFIX, adaptive SUFFIX, HYBRID, and their step helpers."""
