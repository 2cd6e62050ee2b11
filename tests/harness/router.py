"""TEST HARNESS: SGLang's router (the ``sglang-router`` package) in front of test servers,
started as a user starts it: ``python -m sglang_router.launch_router ...``.

:func:`replica_router_args` gives the arguments for replicas behind one policy,
:func:`pd_router_args` those for a prefill-decode pair (the Rust PD router, or the
package's Python ``--mini-lb``, which forwards each request body as sent)."""

from __future__ import annotations

from collections.abc import Sequence

from sglang_spec_ext.bench.router import LaunchedRouter

#: The host's /health runs a one-token generation: on the CPU engine, under load, that can
#: take longer than the router's default health-check timeout.
ROUTER_CPU_ARGS = ("--health-check-timeout-secs", "60", "--health-check-interval-secs", "30")


def replica_router_args(workers: Sequence[str], policy: str) -> list[str]:
    """Replicas behind one policy (cache_aware, round_robin, ...)."""
    return ["--policy", policy, "--worker-urls", *workers, *ROUTER_CPU_ARGS]


def pd_router_args(prefill: str, bootstrap_port: int, decode: str, mini_lb: bool = False
                   ) -> list[str]:  # fmt: skip
    """A prefill server (with its KV bootstrap port) and a decode server."""
    args = ["--pd-disaggregation", "--prefill", prefill, str(bootstrap_port), "--decode", decode]
    if mini_lb:
        return [*args, "--mini-lb"]
    return [*args, "--policy", "round_robin", *ROUTER_CPU_ARGS]


#: The router, launched: ``sglang_spec_ext/bench/router.py`` (benchmarks launch it too).
Router = LaunchedRouter
