"""The embedded models (SmolLM2, its MTP layer and training) and the test-model builders."""
