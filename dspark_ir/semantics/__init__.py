"""The numpy semantics of every op kind: one module per op family.

An op definition (dspark_ir/ops) names its function here as its `reference`; the reference interpreter, the
lowering's numpy executor and the pass contracts all run these functions. They import nothing of the compiler
but the dtype helpers beside them and the two shared numeric helpers of goldens/numerics.py (rb, q8).
"""
