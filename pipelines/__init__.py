"""Hera pipeline definitions, the sublimate CLI and the local runner."""
