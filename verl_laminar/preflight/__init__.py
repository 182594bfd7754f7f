"""Preflight: what would break a run, found before devices are spent (``python -m verl_laminar.preflight``)."""

from verl_laminar.preflight.checks import Options, PreflightError, Report, Row, run_checks, start_checks

__all__ = ["Options", "PreflightError", "Report", "Row", "run_checks", "start_checks"]
