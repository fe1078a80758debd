"""Problem catalog: find, validate, fingerprint and load problem files (no GPU needed)."""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.util
import operator
import re
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from mkb.errors import ProblemFormatError, UnknownProblemError
from mkb.records import FAMILIES, FAMILY_SIZES, ProblemInfo

FILE_RE = re.compile(r"^(\d{2})_([a-z0-9_]+)\.py$")


def family_ranges() -> dict[str, range]:
    """Slot numbers of each family: attention 1-18, kv_cache 19-26, ... linear_attention 62-74."""
    ranges, start = {}, 1
    for family in FAMILIES:
        ranges[family] = range(start, start + FAMILY_SIZES[family])
        start += FAMILY_SIZES[family]
    return ranges


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}


def _literal(node: ast.AST):
    """Evaluate a literal, allowing arithmetic on numeric literals (e.g. 2 * 4096 * 128)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_literal(node.left), _literal(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.Tuple, ast.List)):
        return [_literal(e) for e in node.elts]
    return ast.literal_eval(node)


def _header_comment(text: str, tree: ast.Module) -> str:
    """The comment block right after the module docstring."""
    lines = text.splitlines()
    start = tree.body[0].end_lineno if tree.body else 0
    comment = []
    for line in lines[start:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
        elif stripped == "" and not comment:
            continue
        else:
            break
    return "\n".join(comment).strip()


def parse_problem(path: Path) -> ProblemInfo:
    """Validate one problem file against the contract and describe it, without importing it.

    Raises:
        ProblemFormatError: the file breaks the contract; the message names the rule.
    """
    path = Path(path).resolve()
    where = f"{path.parent.name}/{path.name}"
    match = FILE_RE.match(path.name)
    if not match:
        raise ProblemFormatError(f"{where}: file name must be NN_lowercase_name.py")
    number, name = int(match.group(1)), match.group(2)
    family = path.parent.name
    if family not in FAMILIES:
        raise ProblemFormatError(f"{where}: folder must be one of {', '.join(FAMILIES)}")
    if number not in family_ranges()[family]:
        r = family_ranges()[family]
        raise ProblemFormatError(f"{where}: {family} problems are numbered {r.start:02d}-{r.stop - 1:02d}")
    data = path.read_bytes()
    text = data.decode("utf-8")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise ProblemFormatError(f"{where}: syntax error at line {exc.lineno}: {exc.msg}") from None
    doc = ast.get_docstring(tree, clean=False)
    if not doc or not doc.strip():
        raise ProblemFormatError(f"{where}: needs a one-line module docstring (the task shown to the agent)")
    if "\n" in doc.strip():
        raise ProblemFormatError(f"{where}: the module docstring must be exactly one line")
    source = _header_comment(text, tree)
    if not source:
        raise ProblemFormatError(f"{where}: needs a header comment after the docstring (upstream source facts)")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if "reference" not in functions:
        raise ProblemFormatError(f"{where}: defines no reference(*inputs) function")
    make = functions.get("make_inputs")
    if make is None:
        raise ProblemFormatError(f"{where}: defines no make_inputs(device, scale) function")
    params = [a.arg for a in make.args.args]
    if params[:2] != ["device", "scale"]:
        raise ProblemFormatError(f"{where}: make_inputs must take (device=\"cuda\", scale=\"full\")")
    meta = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            key = node.targets[0].id
            if key in {"DTYPE", "SOL", "EXACT", "MARGIN", "TOLERANCE", "MUTATES", "DSL_SHARE"}:
                try:
                    meta[key] = _literal(node.value)
                except (ValueError, TypeError, SyntaxError):
                    raise ProblemFormatError(f"{where}: {key} must be a literal (numbers, strings, arithmetic)") from None
    if not isinstance(meta.get("DTYPE"), str):
        raise ProblemFormatError(f"{where}: DTYPE must be a string such as \"bf16\"")
    sol = meta.get("SOL")
    if not (isinstance(sol, dict) and all(isinstance(sol.get(k), (int, float)) and sol[k] >= 0
                                          for k in ("flops", "bytes"))):
        raise ProblemFormatError(f"{where}: SOL must be a dict with numeric 'flops' and 'bytes'")
    tolerance = meta.get("TOLERANCE") or {}
    if tolerance and not (isinstance(tolerance, dict) and "factor" in tolerance and tolerance.get("reason")):
        raise ProblemFormatError(f"{where}: TOLERANCE must be {{'factor': x, 'reason': '...'}}")
    if "MARGIN" in meta and "decision_margin" not in functions:
        raise ProblemFormatError(f"{where}: MARGIN needs a decision_margin(*inputs) function")
    mutates = _mutates(where, tree, meta, functions["reference"])
    share = _dsl_share(where, meta)
    return ProblemInfo(
        number=number, name=name, family=family, path=str(path), description=doc.strip(),
        source=source, dtype=meta["DTYPE"], sol_flops=float(sol["flops"]), sol_bytes=float(sol["bytes"]),
        exact=bool(meta.get("EXACT", False)), margin=meta.get("MARGIN"),
        tolerance_factor=float(tolerance.get("factor", 3.0)), tolerance_reason=tolerance.get("reason"),
        mutates=mutates, dsl_share_min=share.get("min"), dsl_share_reason=share.get("reason"),
        fingerprint=hashlib.sha256(data).hexdigest(),
    )


def _dsl_share(where: str, meta: dict) -> dict:
    """DSL_SHARE: {'min': x with 0 <= x < 0.9, 'reason': '...'} lowers the strict policy's floor (issue #24)."""
    if "DSL_SHARE" not in meta:
        return {}
    share = meta["DSL_SHARE"]
    floor = share.get("min") if isinstance(share, dict) else None
    if not (isinstance(share, dict) and set(share) == {"min", "reason"} and isinstance(floor, (int, float))
            and not isinstance(floor, bool) and 0 <= floor < 0.9 and isinstance(share["reason"], str)
            and share["reason"].strip()):
        raise ProblemFormatError(f"{where}: DSL_SHARE must be a literal {{'min': x, 'reason': '...'}} with "
                                 f"0 <= x < 0.9 (it lowers the strict policy's 0.9) and a reason")
    return {"min": float(floor), "reason": share["reason"].strip()}


def _mutates(where: str, tree: ast.Module, meta: dict, reference: ast.FunctionDef) -> tuple[str, ...]:
    """The MUTATES names: a literal tuple of distinct reference parameter names (CONTRACT.md rule 8)."""
    if "MUTATES" not in meta:
        return ()
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "MUTATES")
    names = meta["MUTATES"]
    if not (isinstance(node, ast.Tuple) and names and all(isinstance(n, str) for n in names)):
        raise ProblemFormatError(f"{where}: MUTATES must be a literal tuple of parameter names, "
                                 f"e.g. (\"k_cache\", \"v_cache\")")
    params = [a.arg for a in reference.args.posonlyargs + reference.args.args]
    unknown = [n for n in names if n not in params]
    if unknown:
        raise ProblemFormatError(f"{where}: MUTATES names {unknown[0]!r}, which is not a parameter of "
                                 f"reference({', '.join(params)})")
    if len(set(names)) != len(names):
        raise ProblemFormatError(f"{where}: MUTATES names a parameter twice")
    return tuple(names)


def mutated_positions(info: ProblemInfo, reference) -> list[tuple[int, str]]:
    """(position, name) of each MUTATES input, in MUTATES order, from reference's signature."""
    import inspect

    params = list(inspect.signature(reference).parameters)
    return [(params.index(name), name) for name in info.mutates]


def problem_files(problems_dir: Path) -> list[Path]:
    """Every candidate problem file under problems_dir/<family>/."""
    return sorted(p for family in FAMILIES for p in (Path(problems_dir) / family).glob("*.py"))


def load_catalog(problems_dir: Path) -> list[ProblemInfo]:
    """All problems, validated and sorted by number.

    Raises:
        ProblemFormatError: a file breaks the contract, or two files share a number.
    """
    problems = [parse_problem(p) for p in problem_files(problems_dir)]
    seen: dict[int, ProblemInfo] = {}
    for info in problems:
        if info.number in seen:
            raise ProblemFormatError(
                f"problems p{info.number:02d} and p{info.number:02d} collide: {seen[info.number].path} and {info.path}")
        seen[info.number] = info
    return sorted(problems, key=lambda p: p.number)


def resolve(problem_id: str | int, catalog: list[ProblemInfo]) -> ProblemInfo:
    """Find a problem by 7, 07, p07, 07_name or name.

    Raises:
        UnknownProblemError: nothing matches; the message names the closest matches.
    """
    key = str(problem_id).strip().lower()
    number = None
    if re.fullmatch(r"p?\d{1,2}", key):
        number = int(key.lstrip("p"))
    elif m := re.fullmatch(r"p?(\d{1,2})_([a-z0-9_]+)", key):
        number = int(m.group(1))
    for info in catalog:
        if (number is not None and info.number == number and
                (not re.fullmatch(r"p?\d{1,2}_.+", key) or key.lstrip("p").split("_", 1)[1] == info.name)):
            return info
        if key == info.name:
            return info
    names = [p.name for p in catalog] + [p.id for p in catalog]
    close = [] if number is not None else difflib.get_close_matches(key, names, n=3, cutoff=0.4)
    hint = f" Closest: {', '.join(close)}." if close else ""
    raise UnknownProblemError(
        f"problem '{problem_id}' not found.{hint} Run 'mkb problems list' to see the {len(catalog)} problems.")


def select(patterns: list[str] | None, catalog: list[ProblemInfo], families: list[str] | None = None) -> list[ProblemInfo]:
    """Problems matching ids or glob patterns over ids/slugs (all when none), optionally by family."""
    import fnmatch

    chosen = catalog if not patterns else []
    for pattern in patterns or []:
        if any(ch in pattern for ch in "*?["):
            hits = [p for p in catalog if fnmatch.fnmatch(p.id, pattern) or fnmatch.fnmatch(f"p{p.slug}", pattern)
                    or fnmatch.fnmatch(p.name, pattern)]
            if not hits:
                raise UnknownProblemError(f"no problem matches '{pattern}'. Run 'mkb problems list' to see the ids.")
            chosen += [p for p in hits if p not in chosen]
        else:
            info = resolve(pattern, catalog)
            if info not in chosen:
                chosen.append(info)
    if families:
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise UnknownProblemError(f"unknown family '{unknown[0]}'. Families: {', '.join(FAMILIES)}.")
        chosen = [p for p in chosen if p.family in families]
    return sorted(chosen, key=lambda p: p.number)


def load_module(info: ProblemInfo) -> ModuleType:
    """Import a problem file as a fresh module (this runs its code: imports torch)."""
    module_name = f"mkb_problem_{info.id}"
    spec = importlib.util.spec_from_file_location(module_name, info.path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ProblemFormatError(f"{info.id}: importing {info.path} failed: {type(exc).__name__}: {exc}") from exc
    return module


@lru_cache(maxsize=8)
def _cached_catalog(problems_dir: str, stamp: float) -> tuple[ProblemInfo, ...]:
    return tuple(load_catalog(Path(problems_dir)))


def catalog_for(problems_dir: Path) -> list[ProblemInfo]:
    """load_catalog, cached per directory until a file in it changes."""
    files = problem_files(problems_dir)
    stamp = max((f.stat().st_mtime for f in files), default=0.0) + len(files)
    return list(_cached_catalog(str(Path(problems_dir).resolve()), stamp))
