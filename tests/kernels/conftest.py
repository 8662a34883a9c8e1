"""pypto-backed kernel tests run in CI too: pypto==0.2.0 is a declared dependency, never skipped."""
