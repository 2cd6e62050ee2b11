"""The carry's pins (``gpu/carry.txt``), the lent image's packages (``gpu/image-packages.txt``)
and the ``pip download`` command that fetches the pinned wheels for the lent machine."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parents[1]
REPO = GPU_DIR.parent
CARRY_PINS = GPU_DIR / "carry.txt"
IMAGE_PACKAGES = GPU_DIR / "image-packages.txt"

#: The lent machine: CPython 3.12.3 on x86-64 Linux (Ubuntu 24.04's glibc 2.39).
TARGET_PYTHON = "3.12"
TARGET_GLIBC_MINOR = 39
#: sglang-kernel 0.4.5: built against torch 2.11 (the pinned 0.4.10 leaves 5 torch symbols
#: unresolved there). Only its Python files and the sm90 ``common_ops`` library are carried.
SGL_KERNEL_PIN = ("sglang-kernel", "0.4.5")


def normalize(name: str) -> str:
    """A distribution name in PEP 503 normal form."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    """One carried distribution."""

    name: str
    version: str | None

    @property
    def key(self) -> str:
        return normalize(self.name)

    def spec(self) -> str:
        return f"{self.name}=={self.version}" if self.version else self.name


def parse_pins(text: str) -> list[Pin]:
    """``NAME==VERSION`` lines (``#`` comments and blank lines ignored); a name twice or a
    line that is not ``NAME`` / ``NAME==VERSION`` is an error (``ValueError``)."""
    pins: list[Pin] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([A-Za-z0-9.+!_-]+))?", line)
        if not m:
            raise ValueError(f"line {number}: expected NAME==VERSION, got {raw!r}")
        pin = Pin(m.group(1), m.group(2))
        if pin.key in seen:
            raise ValueError(f"line {number}: {pin.name} is pinned twice")
        seen.add(pin.key)
        pins.append(pin)
    return pins


def load_pins(path: Path = CARRY_PINS, *, versioned: bool = True) -> list[Pin]:
    """The carry's pins; with ``versioned`` every pin must name its version."""
    pins = parse_pins(path.read_text())
    if versioned:
        loose = [p.name for p in pins if not p.version]
        if loose:
            raise ValueError(f"{path}: every carried package needs ==VERSION: {loose}")
    return pins


def load_image(path: Path = IMAGE_PACKAGES) -> dict[str, str | None]:
    """The image's packages: normalized name -> version (None where unknown)."""
    return {p.key: p.version for p in parse_pins(path.read_text())}


def platform_tags(glibc_minor: int = TARGET_GLIBC_MINOR) -> list[str]:
    """Every manylinux tag the lent machine accepts (pip matches ``--platform`` exactly)."""
    tags = [f"manylinux_2_{n}_x86_64" for n in range(glibc_minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def download_command(specs: list[str], dest: Path, python: str | None = None) -> list[str]:
    """``pip download`` of exactly ``specs`` as wheels for the lent machine (no deps)."""
    cmd = [
        python or sys.executable, "-m", "pip", "download", "--no-deps",
        "--only-binary=:all:", "--python-version", TARGET_PYTHON, "--implementation", "cp",
        "--abi", f"cp{TARGET_PYTHON.replace('.', '')}", "--abi", "abi3", "--abi", "none",
        "--disable-pip-version-check", "-d", str(dest),
    ]  # fmt: skip
    for tag in platform_tags():
        cmd += ["--platform", tag]
    return [*cmd, *specs]


def wheel_key(filename: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel file name."""
    parts = Path(filename).name.split("-")
    if len(parts) < 5 or not filename.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {filename}")
    return normalize(parts[0]), parts[1]
