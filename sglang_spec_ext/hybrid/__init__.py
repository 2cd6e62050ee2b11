"""HYBRID's choice between the suffix draft and a model draft (engine-agnostic)."""
