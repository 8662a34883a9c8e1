"""--check-numerics: run the reference interpreter before and after each pass on seeded inputs, check the
pass's declared contract (passes.infra.contracts), and name the pass, the output and the worst element."""
from __future__ import annotations

from typing import Any

from dspark_ir import interp
from dspark_ir.errors import DsparkError
from dspark_ir.graph import Graph
from runner import sample_inputs

from .contracts import check_outputs
from .instruments import Instrument


class NumericsCheck(Instrument):
    uses_before = True

    def start(self, state, g):
        self.seed = state.ctx.seed
        self.inputs = sample_inputs(g, self.seed)
        self.cache: dict[str, list[list[Any]]] = {}
        try:
            self._outputs(g)
        except DsparkError as e:
            raise type(e)(f"--check-numerics: the input graph does not run in the reference interpreter: "
                          f"{e.message}", e.location) from None

    def after_pass(self, state, run, before, g):
        if not run.changed:
            return
        expected = self._outputs(run.pass_.intended(before))
        try:
            got = self._outputs(g)
        except DsparkError as e:
            raise run.fail("contract", f"produced a graph the reference interpreter cannot run: {e.message}",
                           e.location) from None
        contract = run.pass_.contract
        violation = check_outputs(contract, expected, got, [v.name for v in before.returns],
                                  [v.name for v in g.returns])
        if violation is not None:
            raise run.fail("contract", f"broke its numeric contract {contract}: {violation.describe()} "
                                       f"(inputs seed {self.seed})")

    def _outputs(self, g: Graph) -> list[list[Any]]:
        """Returned arrays by position, one list per rank (cached by structural hash)."""
        key = g.structural_hash()
        if key not in self.cache:
            result = interp.run(g, self.inputs)
            per_rank = result if isinstance(result, list) else [result]
            self.cache[key] = [[out[v.name] for v in g.returns] for out in per_rank]
        return self.cache[key]
