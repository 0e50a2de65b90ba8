"""Copy code from real modules into emitted programs.

The code a program carries (its target's runtime, the parity check, the
sample's keys) is written as ordinary package modules, so that it is linted,
type-checked and unit-tested like the rest of tracelog. This module reads
such a module's source and hands the emitter its pieces: the import lines a
program needs, its other module-level statements, and its functions by name,
each copied as written (comments and docstrings kept). What exists only for
the checker is left out: ``from __future__``, tracelog imports, ``if
TYPE_CHECKING:`` blocks and the ``INLINED`` and ``CHECK`` lists themselves.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Inlinable:
    imports: tuple[ast.Import | ast.ImportFrom, ...]
    statements: tuple[str, ...]  # other module-level statements, in order
    functions: dict[str, str] = field(default_factory=dict)  # name -> source, in order
    inlined: tuple[str, ...] = ()  # the functions every program takes (INLINED)
    check: tuple[str, ...] = ()  # those only the parity check takes (CHECK)

    def defined_names(self) -> set[str]:
        """Every name the pieces bind at module level in a program."""
        names = set(self.functions)
        for imp in self.imports:
            names.update((a.asname or a.name).split(".")[0] for a in imp.names)
        for text in self.statements:
            for node in ast.parse(text).body:
                if isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.ClassDef):
                    names.add(node.name)
        return names

    def helpers_used(self, code: str) -> list[str]:
        """The functions outside INLINED and CHECK that `code` calls, with
        those they call in turn, in module order."""
        used: set[str] = set()
        todo = [code]
        while todo:
            called = called_names(todo.pop())
            for name, source in self.functions.items():
                listed = name in self.inlined or name in self.check
                if name not in used and not listed and name in called:
                    used.add(name)
                    todo.append(source)
        return [name for name in self.functions if name in used]


# a name called as a function: not an attribute (x.name(...)), not the end of a longer name
_CALL = re.compile(r"(?<![\w.])([^\W\d]\w*)\(")


def called_names(code: str) -> set[str]:
    """The names `code` calls: one scan of it (a program's functions are long)."""
    return set(_CALL.findall(code))


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _keep_import(node: ast.Import | ast.ImportFrom) -> ast.Import | ast.ImportFrom | None:
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if module == "__future__" or module.split(".")[0] == "tracelog":
            return None
        names = [a for a in node.names if a.name != "TYPE_CHECKING"]
        return ast.ImportFrom(module=module, names=names, level=0) if names else None
    names = [a for a in node.names if a.name.split(".")[0] != "tracelog"]
    return ast.Import(names=names) if names else None


@cache
def inlinable(module: str) -> Inlinable:
    """The pieces of the module named `module`, read from its source file: it
    is not imported (a target's runtime imports its framework)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    text = Path(spec.origin).read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    imports: list[ast.Import | ast.ImportFrom] = []
    statements: list[str] = []
    functions: dict[str, str] = {}
    lists: dict[str, tuple[str, ...]] = {"INLINED": (), "CHECK": ()}
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Import | ast.ImportFrom):
            kept = _keep_import(node)
            if kept is not None:
                imports.append(kept)
            continue
        if (i == 0 and isinstance(node, ast.Expr)) or _is_type_checking(node):
            continue  # the module docstring; what exists for the type checker
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        assert node.end_lineno is not None
        source = "\n".join(lines[first - 1 : node.end_lineno])
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = source
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in lists
        ):
            lists[node.targets[0].id] = tuple(
                str(e.value) if isinstance(e, ast.Constant) else ast.unparse(e)
                for e in getattr(node.value, "elts", [])
            )
        else:
            statements.append(source)
    return Inlinable(tuple(imports), tuple(statements), functions, lists["INLINED"], lists["CHECK"])


def import_block(modules: list[Inlinable], used: set[str] | None = None) -> str:
    """The merged imports of `modules`, as isort (and ruff's I rules) order
    them: the standard library, then the rest; `import x` before `from x`,
    modules by name, one `from x import ...` per module with its names by
    type (CONSTANTS, Classes, functions). With `used`, only imports that bind
    one of those names: a program imports nothing it does not use."""
    straight: dict[bool, set[tuple[str, str]]] = {True: set(), False: set()}
    froms: dict[bool, dict[str, set[tuple[str, str]]]] = {True: {}, False: {}}
    for m in modules:
        for node in m.imports:
            for a in node.names:
                if isinstance(node, ast.ImportFrom):
                    module, bound = node.module or "", a.asname or a.name
                else:
                    module, bound = a.name, a.asname or a.name.split(".")[0]
                if used is not None and bound not in used:
                    continue
                stdlib = module.split(".")[0] in sys.stdlib_module_names
                if isinstance(node, ast.ImportFrom):
                    froms[stdlib].setdefault(module, set()).add((a.name, a.asname or ""))
                else:
                    straight[stdlib].add((a.name, a.asname or ""))
    blocks = []
    for stdlib in (True, False):
        lines = [
            f"import {name}" + (f" as {alias}" if alias else "")
            for name, alias in sorted(straight[stdlib], key=lambda p: (p[0].lower(), p))
        ]
        for module in sorted(froms[stdlib], key=lambda m: (m.lower(), m)):
            members = sorted(
                froms[stdlib][module], key=lambda p: (_member_type(p[0]), p[0].lower(), p)
            )
            names = ", ".join(n + (f" as {alias}" if alias else "") for n, alias in members)
            lines.append(f"from {module} import {names}")
        if lines:
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _member_type(name: str) -> int:
    """isort's order_by_type: CONSTANTS, then Classes, then the rest."""
    if len(name) > 1 and name.isupper():
        return 0
    return 1 if name[:1].isupper() else 2


@lru_cache(maxsize=1024)
def used_names(code: str) -> frozenset[str]:
    """Every name `code` reads (a program keeps the imports that bind one),
    and every string that is an identifier: code may look a module up in
    globals() by name (the parity check's FLOAT_MODULES); cached: the inlined
    runtime recurs in every program."""
    found = set()
    for n in ast.walk(ast.parse(code)):
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            found.add(n.value)
    return frozenset(found)
