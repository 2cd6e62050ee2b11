"""The host bridge: version gate, doctor's probe, the hook registry, named host-bug fixes."""
