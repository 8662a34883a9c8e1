"""The `dspark` command line (mlir-opt style subcommands)."""
