"""Reusable pipeline components: data staging, training paradigms, evaluation."""
