"""The CPU engine: kernel fallbacks, CUDA-graph and overlap emulation, placeholders, serve-cpu (never loaded on a GPU)."""
