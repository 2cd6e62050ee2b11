"""Draft trees in the host's verify layout (engine-agnostic, numpy only)."""
