"""GPU KIT STUB of ``IPython.display``: the names ``sglang/utils.py`` imports, inert."""

from __future__ import annotations

from typing import Any

GPU_KIT_STUB = True


class _Shown:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(...)"


class HTML(_Shown):
    pass


class Markdown(_Shown):
    pass


class Image(_Shown):
    pass


def display(*objs: Any, **kwargs: Any) -> None:
    """Prints each object's repr, as a terminal IPython would."""
    for obj in objs:
        print(repr(obj))


def clear_output(wait: bool = False) -> None:
    return None
