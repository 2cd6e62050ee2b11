"""The host's own model drafts under our control: draft kind, goodput step policy, draft-KV repair."""
