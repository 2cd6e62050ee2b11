"""``sglang-spec-ext tune``: search SUFFIX draft settings (replay traces or launched
servers) and write the best as a config file. ``cli`` parses and reports; ``search``
(replay objective and cost models), ``adaptive`` (optional controller replay),
``live`` (servers per point) and ``modes`` (the two modes) do the work."""

from sglang_spec_ext.tune.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
