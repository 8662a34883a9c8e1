"""List the layers, passes and configs this build knows."""
from __future__ import annotations

import argparse
import importlib

NAME = "list"
HELP = "list layers, passes and configs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", nargs="?", choices=("layers", "passes", "configs", "ops"), help="one section only")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="passes: each pass's origin (seed PR or later form), contract, options with type, default "
                        "and range (as `dspark help PASS`)")


def run(args: argparse.Namespace) -> int:
    sections = [args.what] if args.what else ["layers", "passes", "configs"]
    if args.verbose and args.what == "passes":
        import passes

        print("\n\n".join(passes.describe(name) for name in passes.registered_names()))
        return 0
    for i, section in enumerate(sections):
        if len(sections) > 1:
            print(("\n" if i else "") + f"{section}:")
        for name, summary in _SECTIONS[section]():
            print(f"  {name:<28} {summary}")
    return 0


def _layers():
    from dspark_ir import layers

    return [(name, layers.summary(name)) for name in layers.LAYER_NAMES]


def _passes():
    passes = importlib.import_module("passes")
    return [(name, passes.summary(name)) for name in passes.registered_names()]


def _configs():
    from goldens.config import CONFIG_NAMES, config_by_name

    out = []
    for name in CONFIG_NAMES:
        c = config_by_name(name)
        out.append((name, f"hidden {c.hidden}, {c.heads} heads x {c.head_dim}, tp {c.tp}, B {c.batch}, S {c.seq}"))
    return out


def _ops():
    from dspark_ir.ops import OP_REGISTRY, load_all

    load_all()
    return [(name, (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else cls.family)
            for name, cls in sorted(OP_REGISTRY.items())]


_SECTIONS = {"layers": _layers, "passes": _passes, "configs": _configs, "ops": _ops}
