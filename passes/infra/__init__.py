"""The pass machinery: everything in `passes` that is not a pass (see passes/README.md for the module map).

Pass modules import what they build on from here: `from .infra.base import Pass, RewriteRecord, Skip,
register_pass`, `from .infra.contracts import BITWISE`, `from .infra.rewriting import ...`, and the numbers
they choose by default from `.infra.policy`.
"""
