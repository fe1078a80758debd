"""Trusted anchors: a published kernel library graded through the judge beside our solutions (issue #20).

An anchor is a measurement, never a submission and never shipped code: our small wrapper
(artifact/anchors/<pid>_<package>.py) adapts a problem's `solve(*inputs)` to the library's public API,
and `grade(..., anchor=Anchor.installed(...))` grades it exactly like a submission (same processes,
sandbox, draws, tolerance and timing), with two differences that the record states in
`details.anchor`: the static scan lets the wrapper import the anchor's own modules (every other rule
stands; the findings it waived are listed), and the candidate's cell shows the anchor's site directory
read-only, first on its PYTHONPATH.

The library is installed in a site directory of its own, outside every site-packages the judge's
interpreter imports from (scripts/install_anchors.sh: /opt/mkb-anchors/<package>-<version>/site-packages),
so an ordinary grading's cell does not even contain it. Only artifact/generators/anchors.py passes
`anchor=`: the agent's submit tool, `mkb verify` and the protocol call grade() without it.
"""

from __future__ import annotations

import email.parser
from dataclasses import dataclass
from pathlib import Path

from mkb.errors import MkbError
from mkb.judge.view import SYSTEM_DIRS, toolchain_paths

INSTALL = "bash scripts/install_anchors.sh (after bash scripts/stage_anchors.sh on a machine with a registry)"
"""How an anchor's site directory is made (the end of every error about a missing one)."""


@dataclass(frozen=True)
class Anchor:
    """A published kernel library installed for anchor gradings only."""

    package: str
    """The distribution's name, as its metadata spells it (quack-kernels)."""
    version: str
    """The installed version, read from its metadata (never assumed)."""
    modules: tuple[str, ...]
    """The top-level modules the wrapper may import (static.KERNEL_LIBRARIES keys, e.g. quack)."""
    site: str
    """The site directory holding it and its dependencies (a path ending in site-packages)."""
    distributions: tuple[tuple[str, str], ...] = ()
    """Every distribution installed in site, (name, version), sorted: the anchor's exact environment."""

    @classmethod
    def installed(cls, package: str, modules: tuple[str, ...], site: str | Path) -> Anchor:
        """The anchor of package as installed in site.

        Raises:
            MkbError: site is missing, is not a site-packages directory, or does not hold package.
        """
        root = Path(site).resolve()
        if root.name != "site-packages":
            # The candidate's seal tells installed libraries from the candidate's own files by this name.
            raise MkbError(f"anchor site {root} must be a directory named site-packages. Install it with {INSTALL}.")
        shown = [Path(p) for p in (*SYSTEM_DIRS, *map(str, toolchain_paths()))]
        if any(root == s or s in root.parents for s in shown):
            raise MkbError(f"anchor site {root} lies in a directory every grading's cell shows ({_first(root, shown)}): "
                           f"an agent's kernel could import it. Install it outside them with {INSTALL}.")
        found = dict(distributions(root))
        name = _normal(package)
        if name not in {_normal(n) for n in found}:
            raise MkbError(f"{package} is not installed in {root} (found: {', '.join(sorted(found)) or 'nothing'}). "
                           f"Install it with {INSTALL}.")
        version = next(v for n, v in found.items() if _normal(n) == name)
        missing = [m for m in modules if not (root / m).is_dir() and not (root / f"{m}.py").is_file()]
        if missing:
            raise MkbError(f"{package} in {root} has no module {', '.join(missing)}. Install it with {INSTALL}.")
        return cls(package, version, tuple(modules), str(root), tuple(sorted(found.items())))

    def describe(self) -> dict:
        """What a record's details.anchor says: the package, its version, its modules, where and beside what."""
        return {"package": self.package, "version": self.version, "modules": list(self.modules), "site": self.site,
                "distributions": dict(self.distributions),
                "note": "a trusted anchor: a published library's kernel graded beside ours, never a submission"}


def distributions(site: Path) -> list[tuple[str, str]]:
    """(name, version) of every distribution whose metadata lies in site."""
    found = []
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        headers = email.parser.Parser().parsestr(meta.read_text(errors="replace"), headersonly=True)
        if headers.get("Name") and headers.get("Version"):
            found.append((headers["Name"], headers["Version"]))
    return found


def _first(root: Path, shown: list[Path]) -> Path:
    return next(s for s in shown if root == s or s in root.parents)


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
