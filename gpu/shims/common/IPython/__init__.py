"""GPU KIT STUB of IPython (not IPython): ``sglang/utils.py`` imports ``IPython.display`` at
module level for notebook helpers the server never calls; the lent machine's image has no
IPython. ``gpu/run`` puts ``gpu/shims/common`` last on ``PYTHONPATH``, so a real IPython
wins wherever one is installed."""

__version__ = "0.0.0+gpu-kit-stub"
GPU_KIT_STUB = True
