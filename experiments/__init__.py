"""The studies of docs/results.md, each one sweep through ``sublimate run sweep``."""
