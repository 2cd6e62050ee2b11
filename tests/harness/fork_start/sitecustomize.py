"""TEST ONLY: the host's server starts its scheduler and detokenizer by fork, not spawn.

The launcher (``python -m sglang.launch_server``) sets the ``spawn`` start method, so each
of its two subprocesses starts a fresh interpreter that imports the host again (torch,
transformers, the whole of ``sglang.srt``): on the 2-core test machine about 20 s of a
40 s server start, and twice the CPU. With ``SPEC_EXT_TEST_FORK_START=1`` and this
directory on the server's PYTHONPATH after the CPU-serving site directory (whose
``sitecustomize`` runs the next one on the path, this one), the launcher's
``multiprocessing.set_start_method("spawn", ...)`` sets ``fork`` instead: the children
start from the launcher's memory, with its imports done, and run their own atexit hooks
when they end, as spawned children do. The test servers of
``tests/harness/server.py`` use it; the product (``sglang-spec-ext serve-cpu``, the
benchmarks, the soak) keeps the host's ``spawn``.

What fork would stop checking, this keeps checking: spawn pickles each subprocess's
arguments (the server arguments, with whatever the plugin added to them) and would fail
on one that does not pickle, so every argument but the pipe ends (which spawn hands over
by descriptor) is pickled here before the fork and the start fails the same way.
"""

import os

from sglang_spec_ext.sglang.cpu.site import run_next_sitecustomize

ENV = "SPEC_EXT_TEST_FORK_START"


def _install() -> None:
    import multiprocessing
    import multiprocessing.connection
    import multiprocessing.process
    from multiprocessing.reduction import ForkingPickler

    real_set = multiprocessing.set_start_method

    def set_start_method(method, force=False):
        real_set("fork" if method == "spawn" else method, force=force)

    multiprocessing.set_start_method = set_start_method

    real_start = multiprocessing.process.BaseProcess.start

    def start(self):
        if getattr(self, "_start_method", None) == "fork" or (
            multiprocessing.get_start_method(allow_none=True) == "fork"
        ):
            for value in [*(self._args or ()), *(self._kwargs or {}).values()]:
                if not isinstance(value, multiprocessing.connection.Connection):
                    ForkingPickler.dumps(value)  # what spawn would do, minus the pipes
        return real_start(self)

    multiprocessing.process.BaseProcess.start = start

    # A forked child ends in os._exit, so the atexit hooks it registered (the plugin's
    # SUFFIX snapshot write at shutdown, for one) would never run, where a spawned child
    # ends in sys.exit and runs them. The child starts without the launcher's hooks (a
    # spawned one would not have them) and runs its own when its target returns.
    real_bootstrap = multiprocessing.process.BaseProcess._bootstrap

    def _bootstrap(self, parent_sentinel=None):
        import atexit

        atexit._clear()
        try:
            return real_bootstrap(self, parent_sentinel)
        finally:
            atexit._run_exitfuncs()

    multiprocessing.process.BaseProcess._bootstrap = _bootstrap


if os.environ.get(ENV) == "1":
    _install()
run_next_sitecustomize(os.path.dirname(os.path.abspath(__file__)))
